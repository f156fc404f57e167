"""When a key's next record may start before this record's outputs are acked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agents_stream.durable.runner import RecordInput
from agents_stream.runtime.agent_host import AgentHost


class Runner:
    def __init__(self) -> None:
        self.released: Any = "not called"

    async def run_batch(self, records, report, released, finished) -> None:  # type: ignore[no-untyped-def]
        self.released = released


class Finish:
    def __call__(self, index: int, ok: bool) -> None: ...

    def many(self, indices: list[int], ok: bool) -> None: ...

    def release(self, index: int) -> None: ...

    def release_many(self, indices: list[int]) -> None: ...


@pytest.mark.parametrize(("on_error", "early"), [("dlq", True), ("fail", False)])
def test_keys_are_released_before_the_outputs_ack_only_when_failures_are_dead_lettered(
    on_error: str, early: bool
) -> None:
    """With on_error="fail" a record whose outputs fail stops the worker, and the restart
    sends them again: had its key's next record started, that one's outputs could be out
    first. Dead-lettered, the failed record's outputs never come before the next's."""
    host = AgentHost.__new__(AgentHost)  # only what handle_batch touches
    host._on_error = on_error  # type: ignore[assignment]
    host.runner = Runner()  # type: ignore[assignment]
    host._prepare = lambda msg, key: RecordInput(key=key, seq=0, value=1)  # type: ignore[method-assign]
    asyncio.run(host.handle_batch([(object(), "k")], Finish()))  # type: ignore[list-item]
    assert (host.runner.released is not None) is early  # type: ignore[attr-defined]
