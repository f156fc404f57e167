"""Throughput of AsyncWaitOperator against the Little's-law bound.

For an I/O-bound function with latency L and an operator admitting C elements at once,
throughput cannot exceed C / L; nor can it exceed what the operator sustains when the
call costs nothing (the CPU bound, measured first in this same run). The table reports
measured throughput as a fraction of ``min(cpu bound, C / L)``.

Rates are taken over the middle 80 % of emissions so ramp-up and the final drain (one
latency each) do not count. Run: ``.venv/bin/python bench/bench_aio.py`` (< 30 s).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agents_stream.aio import AsyncWaitOperator, Element

LATENCY = 0.050


async def measure(
    fn: Callable[[Any], Awaitable[Any]], *, n: int, capacity: int, ordered: bool
) -> float:
    """Elements per second over the middle 80 % of emissions."""
    stamps: list[float] = []
    clock = time.perf_counter

    def emit(element: Element, outputs: list[Any]) -> None:
        stamps.append(clock())

    def fail(element: Element, exc: BaseException) -> None:
        raise exc

    op = AsyncWaitOperator(
        fn, ordered=ordered, capacity=capacity, timeout=30.0, emit=emit, fail=fail
    )
    for i in range(n):
        await op.process(Element(i))
    await op.drain()
    lo, hi = n // 10, n - n // 10
    return (hi - lo) / (stamps[hi - 1] - stamps[lo])


async def zero_latency(value: Any) -> Any:
    return value


async def fixed_latency(value: Any) -> Any:
    await asyncio.sleep(LATENCY)
    return value


def jittered(seed: int) -> Callable[[Any], Awaitable[Any]]:
    """Latency uniform in [25, 75] ms (mean 50 ms): ordered mode pays head-of-line waits."""
    rng = random.Random(seed)

    async def fn(value: Any) -> Any:
        await asyncio.sleep(rng.uniform(LATENCY / 2, LATENCY * 1.5))
        return value

    return fn


async def main() -> None:
    started = time.perf_counter()
    cpu = {
        ordered: await measure(zero_latency, n=60_000, capacity=1000, ordered=ordered)
        for ordered in (True, False)
    }
    rows = []
    for capacity, n in ((1000, 30_000), (100, 4_000)):
        for name, make in (
            ("50 ms fixed", lambda: fixed_latency),
            ("25-75 ms", lambda: jittered(1)),
        ):
            for ordered in (True, False):
                rate = await measure(make(), n=n, capacity=capacity, ordered=ordered)
                bound = min(cpu[ordered], capacity / LATENCY)
                rows.append((capacity, name, ordered, rate, bound))

    print(
        f"CPU bound (zero-latency fn, capacity 1000): "
        f"ordered {cpu[True]:,.0f}/s, unordered {cpu[False]:,.0f}/s"
    )
    print()
    header = f"{'capacity':>8}  {'latency':<12} {'mode':<10} {'elements/s':>11} {'bound/s':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for capacity, name, ordered, rate, bound in rows:
        mode = "ordered" if ordered else "unordered"
        print(
            f"{capacity:>8}  {name:<12} {mode:<10} {rate:>11,.0f} {bound:>9,.0f} {rate / bound:>6.2f}"
        )
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
