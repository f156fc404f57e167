"""KeyLanes against a reference model: every job runs once; a key's jobs run one at a
time in submission order; never more than ``limit`` jobs admitted; jobs of distinct keys
that fit under the limit run at the same time; an error stops nothing else."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("faust")

from agents_stream.faust.lanes import KeyLanes

jobs_strategy = st.lists(
    st.tuples(st.sampled_from("abcde"), st.integers(min_value=0, max_value=4)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(jobs=jobs_strategy, limit=st.integers(min_value=1, max_value=6))
def test_a_keys_jobs_in_order_others_concurrent_never_over_the_limit(
    jobs: list[tuple[str, int]], limit: int
) -> None:
    log: list[tuple[str, int, str]] = []  # (event, job number, key)
    running: dict[str, int] = {}
    peak = 0

    async def main() -> None:
        nonlocal peak
        lanes = KeyLanes(limit)

        def job(n: int, key: str, ticks: int):
            async def run() -> None:
                nonlocal peak
                assert running.get(key) is None, f"{key} ran two jobs at once"
                running[key] = n
                log.append(("start", n, key))
                peak = max(peak, len(running))
                for _ in range(ticks):
                    await asyncio.sleep(0)
                log.append(("end", n, key))
                del running[key]

            return run

        for n, (key, ticks) in enumerate(jobs):
            await lanes.submit(key, job(n, key, ticks))
            assert lanes.in_flight <= limit
        await lanes.join()
        assert lanes.in_flight == 0

    asyncio.run(main())
    starts = [n for event, n, _ in log if event == "start"]
    assert sorted(starts) == list(range(len(jobs)))  # each once
    for key in {k for k, _ in jobs}:
        mine = [n for event, n, k in log if event == "start" and k == key]
        assert mine == sorted(mine)  # submission order within a key
    assert peak <= min(limit, len({k for k, _ in jobs}) or 1)


def test_distinct_keys_run_together_up_to_the_limit() -> None:
    """Eight jobs that each wait for all eight to have started: only concurrent lanes
    finish them (one at a time, the first would wait forever)."""

    async def main(limit: int) -> int:
        started = 0
        everyone = asyncio.Event()
        lanes = KeyLanes(limit)

        async def job() -> None:
            nonlocal started
            started += 1
            if started == 8:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 1)

        for key in range(8):
            await lanes.submit(key, job)
        try:
            await lanes.join()
        except TimeoutError:
            return started
        return started

    assert asyncio.run(main(8)) == 8


def test_an_error_is_raised_by_the_next_submit_and_stops_nothing_else() -> None:
    ran: list[str] = []

    async def main() -> None:
        lanes = KeyLanes(4)

        async def fail() -> None:
            raise ValueError("boom")

        async def ok(name: str) -> None:
            await asyncio.sleep(0)
            ran.append(name)

        await lanes.submit("a", fail)
        await lanes.submit("a", lambda: ok("a after the failure"))
        await lanes.submit("b", lambda: ok("b"))
        await asyncio.sleep(0.01)
        with pytest.raises(ValueError, match="boom"):
            await lanes.submit("c", lambda: ok("c"))
        await lanes.join()

    asyncio.run(main())
    assert sorted(ran) == ["a after the failure", "b"]


def test_cancel_stops_running_jobs_and_drops_queued_ones() -> None:
    ran: list[int] = []

    async def main() -> None:
        lanes = KeyLanes(4)
        gate = asyncio.Event()

        async def slow(n: int) -> None:
            await gate.wait()
            ran.append(n)

        for n in range(3):
            await lanes.submit("k", lambda n=n: slow(n))
        await asyncio.sleep(0)
        lanes.cancel()
        gate.set()
        await asyncio.sleep(0.01)
        assert lanes.in_flight == 0

    asyncio.run(main())
    assert ran == []


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        KeyLanes(0)
