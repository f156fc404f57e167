"""Execution controller: key order, concurrency, in-flight limit, commit offsets, epochs."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.runtime.controller import ExecutionController
from agents_stream.runtime.epochs import EpochManager
from agents_stream.runtime.offsets import PartitionOffsets


class Recorder:
    """Submits records with random latencies and records what ran when."""

    def __init__(self, controller: ExecutionController, seed: int = 0) -> None:
        self.controller = controller
        self.rng = random.Random(seed)
        self.started: list[tuple[str, int]] = []
        self.finished: list[tuple[str, int]] = []
        self.running: set[str] = set()
        self.overlap_keys = 0
        self.max_running = 0
        self.offsets = PartitionOffsets()
        self.commits: list[int] = []

    def submit(self, key: str, offset: int, latency: float | None = None) -> None:
        delay = self.rng.random() * 0.005 if latency is None else latency
        self.offsets.start(offset)

        async def work() -> None:
            assert key not in self.running, f"key {key} ran twice at once"
            if self.running:
                self.overlap_keys += 1
            self.running.add(key)
            self.max_running = max(self.max_running, len(self.running))
            self.started.append((key, offset))
            await asyncio.sleep(delay)
            self.running.discard(key)
            self.finished.append((key, offset))

        def done(ok: bool) -> None:
            self.offsets.finish(offset)
            position = self.offsets.committable()
            if position is not None:
                unfinished = [o for k, o in self.started if (k, o) not in self.finished]
                assert all(position <= o for o in unfinished), "commit passed a running record"
                self.offsets.committed = position
                self.commits.append(position)

        self.controller.submit(key, "p0", work, done)


def run(coro):
    return asyncio.run(coro)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from("abcde"), min_size=1, max_size=60), st.integers(0, 10_000))
def test_same_key_in_strict_order_under_random_latencies(keys, seed):
    async def main():
        rec = Recorder(ExecutionController(1000), seed)
        for offset, key in enumerate(keys):
            rec.submit(key, offset)
        await rec.controller.join()
        return rec

    rec = run(main())
    for key in set(keys):
        offsets = [o for k, o in rec.finished if k == key]
        assert offsets == sorted(offsets)
    assert len(rec.finished) == len(keys)
    assert rec.commits[-1] == len(keys)


def test_different_keys_overlap():
    async def main():
        rec = Recorder(ExecutionController(100))
        for offset, key in enumerate("abcdefgh"):
            rec.submit(key, offset, latency=0.02)
        await rec.controller.join()
        return rec

    rec = run(main())
    assert rec.max_running == 8


def test_in_flight_limit_is_never_exceeded_and_capacity_blocks():
    async def main():
        controller = ExecutionController(5)
        rec = Recorder(controller)
        for offset in range(50):
            await controller.wait_for_capacity()
            assert controller.in_flight < 5
            rec.submit(f"k{offset % 7}", offset, latency=0.002)
        await controller.join()
        return controller

    controller = run(main())
    assert controller.peak_in_flight == 5


def test_commit_never_passes_an_unfinished_record():
    async def main():
        rec = Recorder(ExecutionController(100))
        rec.submit("slow", 0, latency=0.05)
        for offset in range(1, 20):
            rec.submit(f"fast{offset}", offset, latency=0.001)
        await asyncio.sleep(0.02)
        assert rec.offsets.committable() is None or rec.offsets.committable() == 0
        await rec.controller.join()
        return rec

    rec = run(main())
    assert rec.commits[-1] == 20


def test_watermark_waits_for_its_epoch():
    async def main():
        controller = ExecutionController(100)
        rec = Recorder(controller)
        fired: list[tuple[int, list]] = []
        rec.submit("a", 0, latency=0.03)
        rec.submit("b", 1, latency=0.001)
        controller.watermark(100, lambda wm: fired.append((wm, list(rec.finished))))
        rec.submit("c", 2, latency=0.001)  # next epoch: may finish before the watermark
        controller.watermark(200, lambda wm: fired.append((wm, list(rec.finished))))
        await asyncio.sleep(0.01)
        assert fired == []  # "a" of epoch 0 is still running
        await controller.join()
        return fired

    fired = run(main())
    assert [wm for wm, _ in fired] == [100, 200]
    assert {("a", 0), ("b", 1)} <= set(fired[0][1])
    assert ("c", 2) in fired[1][1]


def test_strict_mode_records_wait_for_earlier_epochs():
    async def main():
        controller = ExecutionController(100, epoch_mode="strict")
        rec = Recorder(controller)
        events = []
        rec.submit("a", 0, latency=0.02)
        controller.watermark(10, lambda wm: events.append(("wm", wm)))
        rec.submit("b", 1, latency=0.001)  # a different key, but after the watermark
        await asyncio.sleep(0.005)
        assert rec.started == [("a", 0)]
        await controller.join()
        return rec, events

    rec, events = run(main())
    assert rec.started == [("a", 0), ("b", 1)]
    assert events == [("wm", 10)]


def test_drain_abandons_buffered_and_cancels_slow_records():
    async def main():
        controller = ExecutionController(100)
        outcomes = []

        async def slow():
            await asyncio.sleep(5)

        for _ in range(3):
            controller.submit("k", "p0", slow, outcomes.append)
        abandoned = await controller.drain({"p0"}, timeout=0.05)
        return abandoned, outcomes, controller.in_flight

    abandoned, outcomes, in_flight = run(main())
    assert abandoned == 3 and outcomes == [False, False, False] and in_flight == 0


def test_epoch_manager_rejects_unknown_mode():
    with pytest.raises(ValueError):
        EpochManager("sometimes")  # type: ignore[arg-type]
