"""Flight: one journaled call from the moment its code block starts to the moment its
outcome is acknowledged, the window in which a crash makes the call run again.

Why a class: the call starts on whichever thread runs it (a pool thread, or the loop for
coroutine code blocks) and lands on the action's own thread, after the journal ack; the
count of calls between the two (``calls_in_flight``, a metric) is the number of calls a
SIGKILL would run again on the next owner. A call abandoned while it still waits for a
thread (its record cancelled on a revoke, a loss, a shutdown) is dropped: the thread that
takes it later does not start it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError

_LOCK = threading.Lock()
_COUNT = [0]
_QUEUED, _RUNNING, _LANDED, _DROPPED = range(4)


def calls_in_flight() -> int:
    """Journaled calls of this process started and not yet acknowledged."""
    return _COUNT[0]


class Flight:
    __slots__ = ("_check", "_state")

    def __init__(self, check: Callable[[], None] | None = None) -> None:
        self._check = check  # e.g. the action's ownership lease (durable/ownership.py)
        self._state = _QUEUED

    def enter(self) -> None:
        """On the thread about to run the code block (each attempt of a retried call):
        raises instead when the call may not start."""
        if self._check is not None:
            self._check()
        with _LOCK:
            if self._state == _DROPPED:
                raise CancelledError("the call was abandoned before a thread took it")
            if self._state == _QUEUED:
                self._state = _RUNNING
                _COUNT[0] += 1

    def land(self) -> None:
        """The outcome is acknowledged, or the call is given up (idempotent)."""
        with _LOCK:
            if self._state == _RUNNING:
                _COUNT[0] -= 1
                self._state = _LANDED
            elif self._state == _QUEUED:
                self._state = _DROPPED
