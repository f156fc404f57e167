"""Progress of a long scan (cache rebuild, Spark job): records done / total, rate, ETA.

On a terminal it is one line on stderr rewritten in place; otherwise it is a log line
every ``interval`` seconds, e.g.::

    rebuild of orders-action-state[0,1]: 120,000/300,000 records (40%), 55,000/s, ETA 3 s

Callers report work in batches (:meth:`Progress.advance`); the only per-call cost below
the reporting interval is an addition and a clock read.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger("agents_stream.progress")

TTY_INTERVAL = 0.25


class Progress:
    """Counts records against an optional total and reports at most every ``interval`` s.

    Args:
        label: What is being scanned, e.g. ``"rebuild of topic[0,1]"``.
        total: Records expected, if known; :meth:`set_total` may supply it later.
        interval: Seconds between log lines (log mode).
        stream: Where a terminal line goes; defaults to ``sys.stderr``.
        tty: Force terminal (``True``) or log (``False``) mode; default: ``stream.isatty()``.
        logger: Logger for log mode.
        clock: Monotonic clock in seconds (injectable for tests).
    """

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        interval: float = 5.0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self._stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        self._interval = min(interval, TTY_INTERVAL) if tty else interval
        self._log = logger or log
        self._clock = clock
        self._start = clock()
        self._next = self._start + self._interval
        self._shown = False

    def set_total(self, total: int) -> None:
        self.total = total

    def advance(self, n: int = 1) -> None:
        """Add ``n`` records done; reports when the interval has passed."""
        self.done += n
        now = self._clock()
        if now >= self._next:
            self._next = now + self._interval
            self._emit(now)

    def close(self) -> None:
        """Final report (only if something was reported before, so quick scans stay quiet);
        ends the terminal line."""
        if self._shown:
            self._emit(self._clock())
            if self.tty:
                self._stream.write("\n")
                self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self, now: float | None = None) -> str:
        """The progress line as of ``now`` (default: the clock)."""
        now = self._clock() if now is None else now
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.label}: {self.done:,}"]
        if self.total is not None:
            pct = 100 * self.done // self.total if self.total else 100
            parts[0] += f"/{self.total:,} records ({pct}%)"
        else:
            parts[0] += " records"
        parts.append(f"{rate:,.0f}/s")
        if self.total is not None and rate > 0:
            parts.append(f"ETA {_duration(max(self.total - self.done, 0) / rate)}")
        return ", ".join(parts)

    def _emit(self, now: float) -> None:
        self._shown = True
        text = self.line(now)
        if self.tty:
            self._stream.write("\r\x1b[K" + text)
            self._stream.flush()
        else:
            self._log.info("%s", text)


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
