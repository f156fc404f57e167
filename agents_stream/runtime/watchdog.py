"""The freeze watchdog: tells a worker that its process was frozen (SIGSTOP, a VM pause,
a GIL held too long) for longer than its group session may have lasted.

A daemon thread beats the worker's :class:`~agents_stream.durable.ownership.Ownership`
every ``WATCHDOG_BEAT``; after a gap over its ``freeze_after`` that beat suspends every
hold (so no code block starts, nothing is written for them from then on, even before the
loop hears of it), and the loop is told to release them and ask the group."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ..durable.ownership import Ownership

WATCHDOG_BEAT = 0.05  # seconds between beats


def start_watchdog(
    ownership: Ownership,
    cancel: threading.Event,
    loop: asyncio.AbstractEventLoop,
    on_suspended: Callable[[], Any],
    also: Callable[[], None] | None = None,
) -> None:
    """``also``: called every beat, before the freeze check (the connectivity
    watch, ``connectivity.py``: a suspension it makes is reported the same way)."""
    # The clock starts now: a start-up longer than the freeze limit (transactions
    # initialising on a new three-node cluster took 12 s) is not a freeze.
    ownership.resume()

    def watch() -> None:
        while not cancel.wait(WATCHDOG_BEAT):
            suspensions = ownership.suspensions
            if also is not None:
                also()
            ownership.beat()
            if ownership.suspensions != suspensions:
                try:
                    loop.call_soon_threadsafe(on_suspended)
                except RuntimeError:  # the loop is closed: stopping anyway
                    return

    threading.Thread(target=watch, name="agents-stream-watchdog", daemon=True).start()


def freeze_after(conf: dict[str, Any]) -> float:
    """Seconds of freeze after which this member's session may have expired: the last
    heartbeat came up to one interval before the freeze began, and the coordinator
    expires the session ``session.timeout.ms`` after it (half an interval of margin)."""
    session = float(conf.get("session.timeout.ms", 45000))
    heartbeat = float(conf.get("heartbeat.interval.ms", 3000))
    return max(1.0, (session - 1.5 * heartbeat) / 1000)
