"""Guarantee 6: data read from topics is never unpickled by default.

A topic writer plants pickles whose unpickling would run code (create a marker file) in
every place the worker decodes journal or input data; the default codecs must refuse
them with a decode error and the marker must never appear."""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agents_stream import JournalDecodeError
from agents_stream.durable import ActionRef, CallStatus, ContextConfig, RunnerContext
from agents_stream.durable.journal import ActionDone, SentEvent
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.events import EventError
from agents_stream.serde.values import value_codec
from agents_stream.state import InMemoryActionStateStore
from tests.apps.ordering import Sequencer


class Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def double(x):
    return 2 * x


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "pwned"


def test_planted_pickle_in_a_call_result_is_not_unpickled(marker):
    ref = ActionRef("k", 1, "A.a#0")
    cfg = ContextConfig("app", "w", JSON, executor=ThreadPoolExecutor(1))
    store = InMemoryActionStateStore()
    ctx = RunnerContext(ref, store, cfg, {})
    call = ctx._describe(double, (1,), {}, None, None)
    evil = pickle.dumps(Planted(marker))
    store.append([ctx._entry(0, call, CallStatus.SUCCEEDED, 1, result=evil)], 0)
    with pytest.raises(JournalDecodeError):
        RunnerContext(ref, store, cfg, {}).execute(double, 1)
    assert not marker.exists()


def test_planted_pickle_as_input_value_is_a_decode_error(marker):
    with pytest.raises(Exception) as err:
        value_codec(None).decode(pickle.dumps(Planted(marker)))
    assert "pickle" not in type(err.value).__name__.lower()
    assert not marker.exists()


def test_journaled_event_type_is_never_imported(marker):
    import asyncio

    store = InMemoryActionStateStore()
    ref = ActionRef("k", 5, "Sequencer.process#0")
    done = ActionDone(ref, events=(SentEvent("os.system", b"{}"),))
    store.append([done], 0)
    runner = ActionRunner(Sequencer, store, ContextConfig("app", "w", JSON))
    with pytest.raises(EventError, match="not defined in this worker"):
        asyncio.run(runner.run(RecordInput("k", 5, {"n": 0})))
    assert not marker.exists()
