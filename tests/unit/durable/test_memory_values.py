"""Short-term memory keeps values exactly across actions (and so across restarts: the
next action reads the journaled MemorySnapshot), in the domain of journaled results."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings

from agents_stream import Agent, InputEvent, RunnerContext, action
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.errors import UnsupportedValueError
from agents_stream.durable.journal import MemorySnapshot
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.state import InMemoryActionStateStore

from .test_values import same, values


class Remember(Agent):
    seen: ClassVar[list[Any]] = []

    @action(InputEvent)
    @staticmethod
    def act(event: InputEvent, ctx: RunnerContext) -> None:
        if event.input == "read":
            Remember.seen.append(ctx.short_term_memory.get("v", "missing"))
        else:
            ctx.short_term_memory.set("v", event.input["value"])


def run(store: InMemoryActionStateStore, seq: int, value: Any) -> None:
    runner = ActionRunner(Remember, store, ContextConfig("app", "w", JSON), topic="in")
    asyncio.run(runner.run(RecordInput(key="k", seq=seq, value=value)))


@settings(max_examples=60, deadline=None)
@given(values)
def test_memory_round_trip_is_exact(value: Any) -> None:
    store = InMemoryActionStateStore()
    Remember.seen.clear()
    run(store, 0, {"value": value})
    run(store, 1, "read")  # a new action: reads the journaled snapshot
    assert len(Remember.seen) == 1 and same(Remember.seen[0], value)


def test_snapshots_written_as_plain_json_still_read() -> None:
    store = InMemoryActionStateStore(
        [MemorySnapshot("k", {"v": json.dumps({"a": [1, 2]}).encode()}, 0, 0, 0, 1)]
    )
    Remember.seen.clear()
    run(store, 1, "read")
    assert Remember.seen == [{"a": [1, 2]}]


def test_values_outside_the_domain_are_refused_naming_the_slot() -> None:
    store = InMemoryActionStateStore()
    with pytest.raises(UnsupportedValueError, match=r"short_term_memory\['v'\]"):
        run(store, 0, {"value": object()})
