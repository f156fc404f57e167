"""Sync functions run on the loop through the greenlet bridge and wait without a thread."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from agents_stream.durable.bridge import await_, bridged, run_bridged

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("bridge_test", default="unset")


def test_many_sync_functions_wait_at_once_on_one_thread():
    threads: set[int] = set()

    def body(n: int) -> int:
        threads.add(threading.get_ident())
        total = 0
        for i in range(3):
            total += await_(asyncio.sleep(0.01, result=i))
        return n + total

    async def main() -> list[int]:
        # 2,000 concurrent waits: a thread per wait would need 2,000 threads.
        return await asyncio.gather(*(run_bridged(body, n) for n in range(2000)))

    assert asyncio.run(main()) == [n + 3 for n in range(2000)]
    assert threads == {threading.main_thread().ident}


def test_exceptions_cross_the_bridge_both_ways():
    async def fail() -> None:
        raise KeyError("inner")

    def body() -> str:
        try:
            await_(fail())
        except KeyError as exc:
            raise ValueError(f"outer after {exc}") from exc
        return "unreachable"

    with pytest.raises(ValueError, match="outer after 'inner'"):
        asyncio.run(run_bridged(body))


def test_cancellation_reaches_the_waiting_body():
    seen: list[str] = []

    def body() -> None:
        try:
            await_(asyncio.sleep(10))
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        task = asyncio.create_task(run_bridged(body))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen == ["cancelled"]


def test_context_is_the_callers_and_does_not_leak_back():
    def body() -> str:
        before = VAR.get()
        VAR.set("inside")
        await_(asyncio.sleep(0))
        return before + "/" + VAR.get()

    async def main() -> tuple[str, str]:
        VAR.set("caller")
        result = await run_bridged(body)
        return result, VAR.get()

    assert asyncio.run(main()) == ("caller/inside", "caller")


def test_await_outside_the_bridge_is_refused():
    assert not bridged()
    pending = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="outside a bridged"):
        await_(pending)
    pending.close()
