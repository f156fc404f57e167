"""Test app: one Async I/O enrichment with random latency, configured from the environment.

Environment:
    AS_APP_ID, AS_INPUT, AS_OUTPUT: app id and topics (fresh per test).
    AS_ORDERED: "1" (default) ordered, "0" unordered.
    AS_TIME_MODE: "processing" (default) or "event".
    AS_CAPACITY: operator capacity (default 20).
    AS_TIMEOUT: seconds per element, retries included (default 5).
    AS_MAX_LATENCY: upper bound of the random latency in seconds (default 0.05).
    AS_RETRIES: retries of ConnectionError, 50 ms apart (default 0: no retry).
    AS_ON_TIMEOUT: "1" emits a fallback result instead of dead-lettering timeouts.

Value markers (JSON object fields): ``sleep`` fixes the latency, ``fail_times`` raises
ConnectionError on that many first attempts, ``fail`` always raises ValueError.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from typing import Any

from agents_stream import App, AsyncRetryStrategies

app = App(os.environ.get("AS_APP_ID", "aio"), commit_interval=0.3)

MAX_LATENCY = float(os.environ.get("AS_MAX_LATENCY", "0.05"))
_attempts: Counter[str] = Counter()  # attempts per input id, in this process


async def enrich(value: dict[str, Any]) -> dict[str, Any]:
    """Looks the value up in a slow 'service'; the output echoes it plus metadata."""
    ident = f"{value.get('key')}/{value.get('i')}"
    _attempts[ident] += 1
    attempt = _attempts[ident]
    if attempt <= value.get("fail_times", 0):
        raise ConnectionError(f"transient failure {attempt} of {ident}")
    if value.get("fail"):
        raise ValueError(f"permanent failure of {ident}")
    await asyncio.sleep(value.get("sleep", random.random() * MAX_LATENCY))
    return {**value, "enriched": True, "attempt": attempt, "pid": os.getpid()}


def fallback(value: dict[str, Any]) -> dict[str, Any]:
    """on_timeout: a degraded result instead of a dead letter."""
    return {**value, "enriched": False, "timed_out": True, "pid": os.getpid()}


retries = int(os.environ.get("AS_RETRIES", "0"))
app.async_io(
    enrich,
    input=os.environ.get("AS_INPUT", "aio-in"),
    output=os.environ.get("AS_OUTPUT", "aio-out"),
    ordered=os.environ.get("AS_ORDERED", "1") == "1",
    time_mode="event" if os.environ.get("AS_TIME_MODE") == "event" else "processing",
    capacity=int(os.environ.get("AS_CAPACITY", "20")),
    timeout=float(os.environ.get("AS_TIMEOUT", "5")),
    retry=(
        AsyncRetryStrategies.fixed_delay(retries, 0.05).if_exception(ConnectionError)
        if retries
        else None
    ),
    on_timeout=fallback if os.environ.get("AS_ON_TIMEOUT") == "1" else None,
)
