"""CodeBlockPool: an executor whose results reach the loop in batches."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError

import pytest

from agents_stream.durable.pool import CodeBlockPool


def test_submit_returns_results_and_exceptions() -> None:
    pool = CodeBlockPool(2)
    assert pool.submit(lambda a, b=0: a + b, 1, b=2).result(5) == 3
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    pool.shutdown()


def test_blocked_calls_get_their_own_threads_up_to_the_limit() -> None:
    """Ten calls that wait for each other finish: the pool grows while all are busy."""
    pool = CodeBlockPool(10)
    barrier = threading.Barrier(10, timeout=5)
    futures = [pool.submit(barrier.wait) for _ in range(10)]
    assert sorted(f.result(10) for f in futures) == list(range(10))
    assert len(pool._threads) == 10
    pool.shutdown()


def test_threads_are_reused_when_calls_finish_one_by_one() -> None:
    pool = CodeBlockPool(8)
    for n in range(50):
        assert pool.submit(lambda n=n: n).result(5) == n
    assert len(pool._threads) == 1
    pool.shutdown()


def test_run_is_awaitable_on_the_loop_and_keeps_many_in_flight() -> None:
    pool = CodeBlockPool(4)

    async def main() -> list[int]:
        return list(await asyncio.gather(*(pool.run(lambda n=n: n * n) for n in range(200))))

    assert asyncio.run(main()) == [n * n for n in range(200)]
    pool.shutdown()


def test_run_in_executor_accepts_it() -> None:
    pool = CodeBlockPool(1)

    async def main() -> str:
        return await asyncio.get_running_loop().run_in_executor(pool, str.upper, "x")

    assert asyncio.run(main()) == "X"
    pool.shutdown()


def test_shutdown_cancels_queued_work_and_refuses_more() -> None:
    pool = CodeBlockPool(1)
    gate, started = threading.Event(), threading.Event()
    running = pool.submit(lambda: (started.set(), gate.wait(5))[1])
    assert started.wait(5)
    queued = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(CancelledError):
        queued.result(5)
    gate.set()
    assert running.result(5) is True
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(lambda: None)


def test_a_full_pool_is_counted_logged_once_and_drains(caplog: pytest.LogCaptureFixture) -> None:
    """Calls beyond the thread limit wait for a thread: the gauges show it, the wait is
    counted, one warning names the setting to raise, and every call still runs."""
    pool = CodeBlockPool(3)
    gate = threading.Event()
    with caplog.at_level("WARNING", logger="agents_stream.worker"):
        futures = [pool.submit(gate.wait, 5) for _ in range(7)]
    assert (pool.threads, pool.max_workers, pool.waited) == (3, 3, 4)
    assert (pool.running, pool.waiting) == (3, 4)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "all 3 code-block threads are busy" in warnings[0]
    assert "code_block_threads" in warnings[0]
    gate.set()
    assert all(f.result(5) for f in futures)
    pool.shutdown()  # joins the threads: each has counted its call finished
    assert (pool.running, pool.waiting) == (0, 0)
