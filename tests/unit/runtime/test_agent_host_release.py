"""When a key's next record may start before this record's outputs are acked."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

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
    host.runner = SimpleNamespace(traces=None)  # type: ignore[assignment]
    host.controller = object()  # type: ignore[assignment]

    async def make() -> PartitionLane:
        return PartitionLane(host)

    lane = asyncio.run(make())
    assert lane._lane._release_early is early


def test_a_partition_gets_a_new_lane_once_a_drain_stopped_its_lane() -> None:
    """A drain stops a lane whose records outlived its timeout; that lane reports
    nothing more, so the partition's next records (after it is assigned again) must run
    on a new one, and the worker's partition must see it as stale."""
    from collections import defaultdict

    from agents_stream.runtime.partition import Partition

    host = AgentHost.__new__(AgentHost)
    host._on_error = "dlq"  # type: ignore[assignment]
    host.runner = SimpleNamespace(traces=None)  # type: ignore[assignment]
    host.controller = object()  # type: ignore[assignment]
    host._lanes = {}
    host.kept = set()  # type: ignore[assignment]

    async def main() -> None:
        first = host.lane(3)
        assert host.lane(3) is first and host.lane(4) is not first
        part = Partition(
            "in", 3, host=host, watermarks=None, first_expected=-1, arm_at=None,
            seek=lambda p, o: None, stats=defaultdict(int),
        )  # fmt: skip
        assert part.lane is first
        await first.stop()
        second = part.lane
        assert second is not first and not second.stopped and host.lane(3) is second

    asyncio.run(main())
