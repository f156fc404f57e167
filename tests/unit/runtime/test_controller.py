"""Execution controller: key order, concurrency, in-flight limit, commit offsets, epochs."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.runtime.controller import Admitted, ExecutionController
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


class _Finish:
    """How a TaskLane's batch reports, by position among the records it was given."""

    def __init__(self, controller: ExecutionController, items: list[Admitted]) -> None:
        self.controller = controller
        self.items = items

    def __call__(self, index: int, ok: bool) -> None:
        self.controller.finished([self.items[index]], ok)

    def many(self, indices: list[int], ok: bool) -> None:
        self.controller.finished([self.items[i] for i in indices], ok)

    def release(self, index: int) -> None:
        self.controller.released([self.items[index]])

    def release_many(self, indices: list[int]) -> None:
        self.controller.released([self.items[i] for i in indices])


class TaskLane:
    """A lane that runs each start call's records with ``batch(payloads, finish)`` on a
    task of its own; stop cancels them."""

    def __init__(self, controller: ExecutionController, batch) -> None:  # type: ignore[no-untyped-def]
        self.controller = controller
        self.batch = batch
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, records: list[Admitted]) -> None:
        finish = _Finish(self.controller, records)
        task = asyncio.get_running_loop().create_task(
            self.batch([r.payload for r in records], finish)
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks))


_LANES: dict[tuple[int, object, object], TaskLane] = {}


def lane_of(controller: ExecutionController, name: object, batch) -> TaskLane:  # type: ignore[no-untyped-def]
    """One lane per controller, name and batch function (as the worker has one per
    partition)."""
    lane = _LANES.get((id(controller), name, batch))
    if lane is None or lane.controller is not controller:
        lane = _LANES[(id(controller), name, batch)] = TaskLane(controller, batch)
    return lane


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


# -- FLIP-425: timers are records of their watermark's epoch ------------------------------


class Timeline:
    """Work items that log their start and end, for ordering assertions."""

    def __init__(self, controller: ExecutionController) -> None:
        self.controller = controller
        self.log: list[str] = []
        self.running: set[str] = set()
        self.max_running = 0

    def work(self, name: str, key: str, latency: float):
        async def run() -> None:
            assert key not in self.running, f"key {key} ran twice at once"
            self.running.add(key)
            self.max_running = max(self.max_running, len(self.running))
            self.log.append(f"start {name}")
            try:
                await asyncio.sleep(latency)
            finally:
                self.running.discard(key)
            self.log.append(f"end {name}")

        return run

    def submit(self, name: str, key: str, latency: float = 0.001, group: str = "p0") -> None:
        self.controller.submit(key, group, self.work(name, key, latency), lambda ok: None)

    def fire_timers(self, *timers: tuple[str, str], latency: float = 0.01, group: str = "p0"):
        """A watermark callback that logs itself and fires ``(name, key)`` timers."""

        def process(wm: int) -> None:
            self.log.append(f"wm {wm}")
            for name, key in timers:
                self.submit(name, key, latency, group)

        return process


def test_next_watermark_waits_for_the_timers_of_the_previous_one():
    async def main():
        controller = ExecutionController(100)
        t = Timeline(controller)
        t.submit("a", "a", 0.005)
        controller.watermark(1, t.fire_timers(("t1", "k"), latency=0.02))
        controller.watermark(2, t.fire_timers())  # empty epoch: due right after wm 1
        await asyncio.wait_for(controller.join(), 2)
        return t.log, controller.epochs.processed_watermark

    log, processed = run(main())
    assert log.index("end t1") < log.index("wm 2"), log
    assert processed == 2


def test_strict_mode_timers_run_before_later_records():
    async def main():
        controller = ExecutionController(100, epoch_mode="strict")
        t = Timeline(controller)
        t.submit("a", "a", 0.005)
        controller.watermark(1, t.fire_timers(("t-b", "b"), ("t-c", "c")))
        t.submit("b", "b")  # same key as a timer, arrived before the watermark fired
        t.submit("c2", "c")
        t.submit("d", "d")  # another key, later epoch
        await asyncio.wait_for(controller.join(), 2)
        return t.log

    log = run(main())
    last_timer_end = max(log.index("end t-b"), log.index("end t-c"))
    for later in ("start b", "start c2", "start d"):
        assert last_timer_end < log.index(later), log


def test_timer_firings_count_against_the_in_flight_limit():
    async def main():
        controller = ExecutionController(2)
        t = Timeline(controller)
        t.submit("a", "a", 0.005)
        timers = [(f"t{i}", f"k{i}") for i in range(6)] + [("ta", "a")]
        controller.watermark(1, t.fire_timers(*timers, latency=0.005))
        observed = []
        while controller.in_flight or not t.log or "end ta" not in t.log:
            observed.append((controller.in_flight, controller.has_capacity))
            await asyncio.sleep(0.001)
        await asyncio.wait_for(controller.join(), 2)
        return controller, t, observed

    controller, t, observed = run(main())
    assert controller.peak_in_flight <= 2
    assert t.max_running <= 2
    assert all(in_flight <= 2 for in_flight, _ in observed)
    assert len([e for e in t.log if e.startswith("end t")]) == 7


def test_join_returns_only_after_the_timers_a_watermark_fired():
    async def main():
        controller = ExecutionController(100)
        t = Timeline(controller)
        t.submit("a", "a", 0.005)
        controller.watermark(1, t.fire_timers(("t1", "k"), latency=0.02))
        await asyncio.wait_for(controller.join(), 2)
        return list(t.log), t.running

    log, running = run(main())
    assert "end t1" in log and not running


def test_drain_returns_only_when_nothing_of_its_groups_runs():
    async def main():
        controller = ExecutionController(100)
        t = Timeline(controller)
        t.submit("a", "a", 0.01, group="p0")
        # A watermark that becomes due while the drain waits fires a timer of p0.
        controller.watermark(1, t.fire_timers(("t1", "k"), latency=0.01, group="p0"))
        abandoned = await controller.drain({"p0"}, timeout=1.0)
        after_drain = list(t.log)
        await asyncio.sleep(0.05)
        return abandoned, after_drain, list(t.log), controller.in_flight

    abandoned, after_drain, log, in_flight = run(main())
    assert log == after_drain, "work of a drained group ran after drain() returned"
    assert "start t1" not in log and abandoned == 1 and in_flight == 0


def test_drain_of_one_group_keeps_the_others_running():
    async def main():
        controller = ExecutionController(100)
        t = Timeline(controller)
        t.submit("a", "a", 0.01, group="p0")
        controller.watermark(1, t.fire_timers(("t1", "k"), latency=0.01, group="p1"))
        await controller.drain({"p0"}, timeout=1.0)
        await asyncio.wait_for(controller.join(), 2)
        return t.log

    assert "end t1" in run(main())


def test_raising_done_callback_does_not_stall_its_key(caplog):
    async def main():
        controller = ExecutionController(100)
        t = Timeline(controller)

        def boom(ok: bool) -> None:
            raise RuntimeError("done failed")

        controller.submit("k", "p0", t.work("first", "k", 0.001), boom)
        t.submit("second", "k")
        await asyncio.wait_for(controller.join(), 2)
        return t.log, controller.in_flight

    log, in_flight = run(main())
    assert "end second" in log and in_flight == 0
    assert "done failed" in caplog.text


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("record"), st.sampled_from("abcd")),
            st.tuples(st.just("watermark"), st.lists(st.sampled_from("abcd"), max_size=4)),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 4),
    st.sampled_from(["out_of_order", "strict"]),
    st.integers(0, 10_000),
)
def test_timers_as_records_under_random_schedules(ops, limit, mode, seed):
    """Whatever the schedule: no deadlock, key order, the limit, and each watermark's
    timers finish before the next watermark fires (and, strict, before later records)."""
    rng = random.Random(seed)

    async def main():
        controller = ExecutionController(limit, epoch_mode=mode)
        t = Timeline(controller)
        later_records: dict[int, list[str]] = {}  # watermark -> records submitted after it
        watermarks = 0
        for n, (op, arg) in enumerate(ops):
            await controller.wait_for_capacity()  # what the worker's consume loop does
            if op == "record":
                name = f"r{n}"
                t.submit(name, arg, rng.random() * 0.003)
                for names in later_records.values():
                    names.append(name)
            else:
                watermarks += 1
                timers = [(f"t{watermarks}.{i}", key) for i, key in enumerate(arg)]
                controller.watermark(watermarks, t.fire_timers(*timers, latency=0.001))
                later_records[watermarks] = []
        await asyncio.wait_for(controller.join(), 5)
        return controller, t, later_records, watermarks

    controller, t, later_records, watermarks = run(main())
    log = t.log
    assert controller.peak_in_flight <= limit and t.max_running <= limit
    assert controller.epochs.processed_watermark == (watermarks or None)
    for wm in range(1, watermarks + 1):
        ends = [i for i, e in enumerate(log) if e.startswith(f"end t{wm}.")]
        if wm < watermarks and ends:
            assert max(ends) < log.index(f"wm {wm + 1}"), log
        if mode == "strict" and ends:
            for name in later_records[wm]:
                assert max(ends) < log.index(f"start {name}"), log


# -- batched work -------------------------------------------------------------------------
class Lanes:
    """Batched records: each batch reports its records after a per-record delay."""

    def __init__(self, controller: ExecutionController) -> None:
        self.controller = controller
        self.batches: list[list[tuple[str, int]]] = []
        self.running: set[str] = set()
        self.order: dict[str, list[int]] = {}
        self.done: list[tuple[int, bool]] = []
        self.delays: dict[int, float] = {}

    async def run(self, payloads: list[tuple[str, int]], finish) -> None:  # type: ignore[no-untyped-def]
        self.batches.append(payloads)
        for key, _ in payloads:
            assert key not in self.running, f"key {key} ran twice at once"
            self.running.add(key)

        async def one(i: int, key: str, offset: int) -> None:
            await asyncio.sleep(self.delays.get(offset, 0.001))
            self.running.discard(key)
            self.order.setdefault(key, []).append(offset)
            finish(i, True)

        await asyncio.gather(*(one(i, k, o) for i, (k, o) in enumerate(payloads)))

    def submit(self, key: str, offset: int, lane: str = "p0") -> None:
        runs = lane_of(self.controller, lane, self.run)
        done = lambda ok: self.done.append((offset, ok))  # noqa: E731
        self.controller.submit_to(runs, key, lane, (key, offset), done)


def test_batched_records_started_together_share_one_batch_and_keep_key_order() -> None:
    async def main() -> Lanes:
        lanes = Lanes(ExecutionController(100))
        for offset in range(30):
            lanes.submit(f"k{offset % 5}", offset)
        await lanes.controller.join()
        return lanes

    lanes = run(main())
    assert len(lanes.batches[0]) == 5  # one record per key starts at once, in one batch
    assert all(len({k for k, _ in b}) == len(b) for b in lanes.batches)  # distinct keys
    for key, offsets in lanes.order.items():
        assert offsets == sorted(offsets), key
    assert sorted(o for o, ok in lanes.done if ok) == list(range(30))


def test_a_reported_record_releases_its_key_while_its_batch_still_runs() -> None:
    async def main() -> Lanes:
        lanes = Lanes(ExecutionController(100))
        lanes.delays = {0: 0.3}  # k0's first record holds its batch open
        lanes.submit("k0", 0)
        lanes.submit("k1", 1)
        lanes.submit("k1", 2)  # waits for offset 1 only, not for the whole batch
        await asyncio.sleep(0.15)
        assert (2, True) in lanes.done
        await lanes.controller.join()
        return lanes

    run(main())


def test_draining_a_lane_abandons_what_its_batch_did_not_report() -> None:
    async def main() -> tuple[int, Lanes]:
        lanes = Lanes(ExecutionController(100))
        lanes.delays = {0: 30.0, 1: 0.001}
        lanes.submit("k0", 0)
        lanes.submit("k1", 1)
        lanes.submit("k0", 2)  # buffered behind offset 0
        lanes.submit("k9", 9, lane="p1")  # another lane: untouched by the drain
        await asyncio.sleep(0.1)
        abandoned = await lanes.controller.drain({"p0"}, timeout=0.2)
        await lanes.controller.join()
        return abandoned, lanes

    abandoned, lanes = run(main())
    assert abandoned == 2  # offset 0 (cancelled in its batch) and 2 (buffered)
    assert sorted(lanes.done) == [(0, False), (1, True), (2, False), (9, True)]
    assert lanes.controller.in_flight == 0


def test_wait_for_slots_returns_once_that_many_records_can_be_admitted():
    """The worker consumes again only from a low-water mark of free slots: the wait
    must end when enough records finished, not at the first free slot."""

    async def main() -> list[int]:
        controller = ExecutionController(max_in_flight=4)
        gates = [asyncio.Event() for _ in range(4)]
        for n, gate in enumerate(gates):
            controller.submit(f"k{n}", "p0", gate.wait, lambda ok: None)
        await asyncio.sleep(0)
        seen: list[int] = []
        waiter = asyncio.ensure_future(controller.wait_for_slots(3))
        for gate in gates[:3]:
            gate.set()
            await asyncio.sleep(0.01)
            seen.append(int(waiter.done()))
        await waiter
        assert controller.free_slots >= 3
        gates[3].set()
        await controller.join()
        # Nothing in flight: the wait returns at once, whatever it asks for.
        await asyncio.wait_for(controller.wait_for_slots(100), 1)
        return seen

    assert run(main()) == [0, 0, 1]


def test_a_released_key_runs_its_next_record_while_the_first_stays_in_flight() -> None:
    """``finish.release(i)``: the key is free, the record is not finished (not
    committable, still counted in flight) until ``finish(i, ok)``, and that late finish
    does not free the key a second time (the next record holds it by then)."""

    async def main() -> None:
        controller = ExecutionController(100)
        finished: list[int] = []
        started: list[int] = []
        gates = {0: asyncio.Event(), 1: asyncio.Event()}

        async def batch(payloads: list[int], finish) -> None:  # type: ignore[no-untyped-def]
            async def one(i: int, offset: int) -> None:
                started.append(offset)
                if offset == 0:
                    finish.release(i)
                    finish.release(i)  # at most once
                if offset in gates:
                    await gates[offset].wait()
                finish(i, True)

            await asyncio.gather(*(one(i, o) for i, o in enumerate(payloads)))

        for offset in (0, 1, 2):
            lane = lane_of(controller, "p0", batch)
            controller.submit_to(lane, "k", "p0", offset, lambda ok, o=offset: finished.append(o))

        async def settle() -> None:
            for _ in range(10):
                await asyncio.sleep(0)

        await settle()
        assert started == [0, 1] and finished == []
        assert controller.in_flight == 3  # offset 0 released, not finished
        gates[0].set()
        await settle()
        assert finished == [0] and started == [0, 1]  # offset 1 still holds the key
        gates[1].set()
        await controller.join()
        assert finished == [0, 1, 2] and started == [0, 1, 2]

    run(main())


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from("abcd"), min_size=1, max_size=40),
    st.integers(1, 8),
    st.sampled_from(["out_of_order", "strict"]),
    st.integers(0, 10_000),
)
def test_records_reported_in_groups_keep_key_order_and_the_limit(keys, limit, mode, seed):
    """``finish.many`` / ``finish.release_many`` (a group commit's records reported in
    one call) hold what one call per record holds: per key, records start in order and
    only once the previous one was released or finished; the in-flight limit holds;
    every record finishes; nothing is left in flight."""
    rng = random.Random(seed)
    started: list[tuple[str, int]] = []
    freed: set[int] = set()  # records whose key was released or that finished
    finished: list[int] = []

    async def main() -> ExecutionController:
        controller = ExecutionController(limit, epoch_mode=mode)

        async def batch(payloads: list[tuple[str, int]], finish) -> None:  # type: ignore[no-untyped-def]
            for key, offset in payloads:
                earlier = [o for k, o in started if k == key]
                assert all(o in freed for o in earlier), (key, offset, "started too early")
                assert all(o < offset for o in earlier), (key, offset, "out of order")
                assert controller.in_flight <= limit
                started.append((key, offset))
            todo = list(range(len(payloads)))
            rng.shuffle(todo)
            while todo:
                n = rng.randint(1, 3)
                group, todo = todo[:n], todo[n:]
                await asyncio.sleep(rng.random() * 0.002)
                if rng.random() < 0.5:
                    finish.release_many(group)
                    freed.update(payloads[i][1] for i in group)
                    await asyncio.sleep(0)
                freed.update(payloads[i][1] for i in group)
                finish.many(group, True)
                finish.many(group, True)  # a second report is ignored

        for offset, key in enumerate(keys):
            lane = lane_of(controller, "p0", batch)
            done = lambda ok, o=offset: finished.append(o)  # noqa: E731
            controller.submit_to(lane, key, "p0", (key, offset), done)
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        await asyncio.wait_for(controller.join(), 10)
        return controller

    controller = run(main())
    assert sorted(finished) == list(range(len(keys)))
    assert controller.in_flight == 0 and controller.waiting == 0


async def _batch_that_finishes_at_once(payloads: list[str], finish: object) -> None:
    _RAN.append(list(payloads))
    for i in range(len(payloads)):
        finish(i, True)  # type: ignore[operator]


_RAN: list[list[str]] = []


def test_a_drain_abandons_the_next_record_its_own_releases_would_start() -> None:
    """A record of the drained group that became ready in the same loop turn as the drain
    (its key's previous work just finished) is abandoned; the drain's release of it pumps
    the key, and the key's next buffered record must not slip into a batch that starts
    after the drain has returned (it would run on this worker while the partition is
    handed over)."""

    async def main() -> tuple[int, dict[str, bool]]:
        controller = ExecutionController(100)
        ends: dict[str, bool] = {}
        result: dict[str, int] = {}

        async def drain() -> None:
            result["abandoned"] = await controller.drain({"G"}, 1.0)
            result["ran"] = len(_RAN)

        async def timer() -> None:  # finishes in the turn the drain starts
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(drain()))

        controller.submit("K", "G", timer, lambda ok: ends.setdefault("timer", ok))
        for name in ("r2", "r3"):
            lane = lane_of(controller, "G", _batch_that_finishes_at_once)
            controller.submit_to(lane, "K", "G", name, lambda ok, n=name: ends.setdefault(n, ok))
        for _ in range(20):
            await asyncio.sleep(0)
        assert result["ran"] == 0
        return result["abandoned"], ends

    _RAN.clear()
    abandoned, ends = run(main())
    assert _RAN == [], "a record of the drained group ran after the drain"
    assert abandoned == 2
    assert ends == {"timer": True, "r2": False, "r3": False}


def test_a_drain_abandons_records_its_releases_admit_from_the_waiting_queue() -> None:
    async def main() -> tuple[int, dict[str, bool]]:
        controller = ExecutionController(2)
        ends: dict[str, bool] = {}
        for name, key in (("a", "K1"), ("b", "K2"), ("c", "K3")):  # c waits: limit 2
            lane = lane_of(controller, "G", _batch_that_finishes_at_once)
            controller.submit_to(lane, key, "G", name, lambda ok, n=name: ends.setdefault(n, ok))
        abandoned = await controller.drain({"G"}, 1.0)  # before the batch starts
        for _ in range(10):
            await asyncio.sleep(0)
        return abandoned, ends

    _RAN.clear()
    abandoned, ends = run(main())
    assert _RAN == [], "a record admitted during the drain ran after it"
    assert abandoned == 3
    assert ends == {"a": False, "b": False, "c": False}
