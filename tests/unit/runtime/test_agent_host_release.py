"""When a key's next record may start before this record's outputs are acked."""

from __future__ import annotations

import asyncio

import pytest

from agents_stream.runtime.agent_host import AgentHost, PartitionLane


@pytest.mark.parametrize(("on_error", "early"), [("dlq", True), ("fail", False)])
def test_keys_are_released_before_the_outputs_ack_only_when_failures_are_dead_lettered(
    on_error: str, early: bool
) -> None:
    """With on_error="fail" a record whose outputs fail stops the worker, and the restart
    sends them again: had its key's next record started, that one's outputs could be out
    first. Dead-lettered, the failed record's outputs never come before the next's."""
    host = AgentHost.__new__(AgentHost)  # only what a lane reads of it
    host._on_error = on_error  # type: ignore[assignment]
    host.runner = object()  # type: ignore[assignment]
    host.controller = object()  # type: ignore[assignment]

    async def make() -> PartitionLane:
        return PartitionLane(host)

    lane = asyncio.run(make())
    assert lane._lane._release_early is early
