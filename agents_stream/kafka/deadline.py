"""Deadlines the worker enforces itself on blocking Kafka client calls.

Why: librdkafka's blocking calls take a timeout, and some do not keep it. On a
three-node Apache Kafka 4.1 cluster, a controlled shutdown of the broker holding the
group coordinator left ``send_offsets_to_transaction(..., 30.0)`` waiting for over five
minutes (librdkafka 2.12.1: the coordinator request's own timeout is never checked,
confluentinc/librdkafka#5456, #5511; still open for 2.16.1, the newest confluent-kafka
release served here). The worker's only Kafka thread sat in it: no record committed, no
line logged, readiness still green.

So a call that may block runs on a thread of its own, and the caller waits for it at
most ``limit`` seconds. Past that the caller gets :class:`Blocked` (one WARNING line
naming the operation and how long it has blocked), :attr:`Deadline.blocked` says what is
stuck (the readiness probe fails while it is set), and the caller recovers: the
transactional producer is replaced, which fences the stuck one's transaction
(``kafka/transactions.py``); a stuck offset commit is left behind and retried by the next
commit. The stuck thread is abandoned (a C call cannot be interrupted); when it returns
at last, that is logged too. Any later call that returns in time clears ``blocked``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import KafkaIOError

log = logging.getLogger("agents_stream.kafka")

T = TypeVar("T")

# Seconds a call may take past the timeout it was given before the worker stops waiting:
# librdkafka keeps its timeouts to within a poll round or two when it keeps them at all.
GRACE = 5.0


class Blocked(KafkaIOError):
    """A client call did not return within the deadline the worker enforces; it still
    runs (abandoned) on its own thread, and its client must be taken as unusable."""

    def __init__(self, operation: str, seconds: float) -> None:
        super().__init__(
            f"{operation} blocked for {seconds:.1f}s, past the worker's deadline "
            "(a librdkafka call that does not keep its timeout)"
        )
        self.operation = operation
        self.seconds = seconds


class _Call:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class Deadline:
    """Runs blocking client calls with a bound that holds (see the module doc).

    ``on_blocked(operation, seconds)`` is called once per call that passes its deadline
    (the worker counts it); :attr:`count` is how many have, :attr:`blocked` names the
    last one until a call returns in time again.
    """

    def __init__(self, on_blocked: Callable[[str, float], None] | None = None) -> None:
        self.on_blocked = on_blocked
        self.blocked: str | None = None
        self.count = 0
        self.abandoned = 0  # calls past their deadline that have not returned yet
        self.in_a_row = 0  # calls past their deadline since one last returned in time
        self._lock = threading.Lock()

    def call(self, operation: str, limit: float, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, or :class:`Blocked` once it has run ``limit`` seconds."""
        call = _Call()
        began = time.monotonic()

        def run() -> None:
            try:
                call.result = fn(*args)
            except BaseException as exc:  # handed to the caller, or logged if abandoned
                call.error = exc
            with self._lock:  # against the caller deciding to abandon it meanwhile
                call.done.set()
                late = abandoned.is_set()
                if late:
                    self.abandoned -= 1
            if late:
                log.warning(
                    "%s returned after %.1fs (abandoned at its deadline): %s",
                    operation,
                    time.monotonic() - began,
                    call.error or "ok",
                )

        abandoned = threading.Event()
        # A thread per call: these are a few per second at most (commits), and a thread
        # that blocks forever must not hold up the next call.
        threading.Thread(target=run, name=f"agents-stream-{operation}", daemon=True).start()
        if not call.done.wait(limit):
            with self._lock:
                if not call.done.is_set():
                    abandoned.set()
                    self.abandoned += 1
            if abandoned.is_set():
                seconds = time.monotonic() - began
                self.count += 1
                self.in_a_row += 1
                self.blocked = operation
                log.warning(
                    "%s has blocked for %.1fs (deadline %.1fs): giving up on it",
                    operation,
                    seconds,
                    limit,
                )
                if self.on_blocked is not None:
                    self.on_blocked(operation, seconds)
                raise Blocked(operation, seconds)
        self.blocked = None
        self.in_a_row = 0
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]
