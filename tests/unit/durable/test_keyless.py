"""Keyless records (``RecordInput(keyless=True)``): no memory, no timers, a clear error."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable import ContextConfig
from agents_stream.durable.errors import KeylessRecordError
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.state import InMemoryActionStateStore

CFG = ContextConfig(app_id="app", worker_id="w1", codec=JSON, executor=ThreadPoolExecutor(1))


class Uses(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        what = event.input["use"]
        if what == "memory":
            ctx.short_term_memory.set("n", 1)
        elif what == "timers":
            ctx.timers.register_processing_time(1)
        ctx.send_event(OutputEvent(output={"key": event.key}))


def run(use: str, *, keyless: bool):
    runner = ActionRunner(Uses, InMemoryActionStateStore(), CFG, topic="in")
    record = RecordInput("", 7, {"use": use}, 2, keyless=keyless)
    return asyncio.run(runner.run(record))


@pytest.mark.parametrize("use", ["memory", "timers"])
def test_keyless_record_touching_per_key_state_raises_a_clear_error(use):
    with pytest.raises(KeylessRecordError) as info:
        run(use, keyless=True)
    assert str(info.value) == (
        "record in[2]@7 has no key: short-term memory is per key; "
        "key your records or keep state elsewhere"
    )
    assert (info.value.topic, info.value.partition, info.value.offset) == ("in", 2, 7)


def test_keyless_record_without_state_runs_with_empty_key():
    assert run("nothing", keyless=True).outputs == [{"key": ""}]


def test_empty_string_key_is_still_a_key():
    assert run("memory", keyless=False).outputs == [{"key": ""}]
