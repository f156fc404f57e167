"""A registry refusal mid-run waits and retries (agents_stream/host/registry_wait.py)."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import pytest

from agents_stream.host.registry_wait import RegistryWait
from agents_stream.serde.errors import SchemaRefused

REFUSED = SchemaRefused(
    "schema registry refused ActionState v6 under subject 's': incompatible (HTTP 409)",
    subject="s",
    version="ActionState v6",
    reason="incompatible (HTTP 409)",
)


def test_records_wait_with_one_warning_then_resume(caplog: pytest.LogCaptureFixture) -> None:
    stats: defaultdict[str, int] = defaultdict(int)
    pauses: list[tuple[str, int, bool]] = []
    wait = RegistryWait(stats, lambda t, p, on: pauses.append((t, p, on)), first=0.01, most=0.02)
    refusals = {"left": 4}

    async def attempt() -> str:
        if refusals["left"]:
            refusals["left"] -= 1
            raise REFUSED
        return "done"

    async def main() -> list[str]:
        runs = [wait.retry("in", 0, f"in[0]@{n}", REFUSED, attempt) for n in range(3)]
        return list(await asyncio.gather(*runs))

    caplog.set_level(logging.INFO, logger="agents_stream")
    assert asyncio.run(main()) == ["done"] * 3
    assert pauses == [("in", 0, True), ("in", 0, False)]  # paused once, resumed once
    assert stats["registry_retries"] >= 5 and wait.paused == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 409" in warnings[0] and "in[0]" in warnings[0]
    assert any("resumed" in r.getMessage() for r in caplog.records)


def test_cancelled_wait_resumes_the_partition_and_other_errors_pass() -> None:
    pauses: list[bool] = []
    wait = RegistryWait(defaultdict(int), lambda t, p, on: pauses.append(on), first=10)

    async def refused() -> None:
        raise REFUSED

    async def bad() -> None:
        raise ValueError("the record's own fault")

    async def main() -> None:
        task = asyncio.ensure_future(wait.retry("in", 1, "in[1]@0", REFUSED, refused))
        await asyncio.sleep(0.01)
        task.cancel()  # a revoke: the record stays uncommitted for the next owner
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(ValueError):  # tried at once: the record's own fault, no wait
            await wait.retry("in", 1, "in[1]@0", REFUSED, bad)

    asyncio.run(main())
    assert pauses == [True, False] and wait.paused == 0


def test_stop_ends_every_wait_at_once() -> None:
    wait = RegistryWait(defaultdict(int), first=30)

    async def refused() -> None:
        raise REFUSED

    async def main() -> None:
        waits = [
            asyncio.ensure_future(wait.retry("in", p, f"in[{p}]@0", REFUSED, refused))
            for p in (0, 1)
        ]
        await asyncio.sleep(0.05)
        wait.stop()  # SIGTERM: no 30 s backoff sat out
        done, _ = await asyncio.wait(waits, timeout=2)
        assert len(done) == 2 and all(t.cancelled() for t in done)

    asyncio.run(main())
    assert wait.paused == 0
