"""AckFuture: a ``concurrent.futures.Future`` cheap enough for one per journal record.

The stock Future allocates a ``threading.Condition`` (a lock and a waiter list) per
instance and takes it on every call; a worker creates a few per input record, so that
was a measurable share of the hot path. An acknowledgement is never cancelled and is
rarely waited on by a blocked thread (the event loop awaits it through a done callback),
so this one takes no lock between its resolver and its registrants (a list and the GIL's
atomic steps, see :meth:`add_done_callback`) and creates a ``threading.Event`` only when a
thread actually blocks in :meth:`result`.

It is a drop-in for the uses this library makes of futures: ``done``, ``result``,
``exception`` (with timeouts), ``add_done_callback``, ``set_result``/``set_exception``,
and ``asyncio.wrap_future``. ``concurrent.futures.wait``/``as_completed`` are not
supported (they rely on the stock Future's internals).

A leaf module: the durable core creates these (code blocks, groups of sends) and so do
the Kafka adapters (a producer's delivery reports); neither owns the type. A blocking
:meth:`result` just blocks: on a thread that serves a producer's reports, wait through
the producer (``AckingProducer.wait``, the core's ``AckServing.wait``) instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, InvalidStateError
from typing import Any, TypeVar

T = TypeVar("T")

_LOCK = threading.Lock()
_PENDING, _DONE = 0, 1
log = logging.getLogger("agents_stream.durable")


class AckFuture(Future[T]):
    def __init__(self) -> None:  # no super().__init__: no Condition
        self._ack_state = _PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future[T]], object]] = []
        self._event: threading.Event | None = None

    def __repr__(self) -> str:
        state = "pending" if self._ack_state == _PENDING else "finished"
        return f"<AckFuture at {id(self):#x} state={state}>"

    # -- state ------------------------------------------------------------------------
    def done(self) -> bool:
        return self._ack_state == _DONE

    def cancel(self) -> bool:
        return False  # an append in flight cannot be taken back

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def set_running_or_notify_cancel(self) -> bool:
        return True

    # -- reading ----------------------------------------------------------------------
    def _wait(self, timeout: float | None) -> None:
        if self._ack_state == _DONE:
            return
        with _LOCK:  # among waiting threads only: the resolver never takes it
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        # Stored before this check, read by the resolver after it marks the future done:
        # one of the two sees the other's write.
        if self._ack_state == _DONE:
            return
        if not event.wait(timeout):
            raise TimeoutError()

    def result(self, timeout: float | None = None) -> T:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def outcome(self) -> tuple[T | None, BaseException | None]:
        """``(result, None)`` or ``(None, error)`` of a done future, in one call: the
        record path reads every code block's result and every ack this way."""
        assert self._ack_state == _DONE
        return self._value, self._error

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        if self._ack_state == _DONE:
            self._call(fn)
            return
        # No lock: the resolver marks the future done and then drains the list, this
        # thread appends and then checks the mark, and each callback is taken by exactly
        # one ``pop`` (atomic under the GIL), whichever thread gets to it.
        self._callbacks.append(fn)
        if self._ack_state == _DONE:
            self._drain()

    # -- resolving --------------------------------------------------------------------
    def set_result(self, result: T) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(None, exception or CancelledError())

    def _finish(self, value: Any, error: BaseException | None) -> None:
        # Lock-free (see add_done_callback): a lock shared with the loop thread convoyed.
        # A resolver preempted inside its critical section (every GIL switch interval)
        # left the loop blocked on the lock until the resolver got the GIL back.
        # One thread resolves an ack, so the double-set check needs no atomicity.
        if self._ack_state == _DONE:
            raise InvalidStateError(f"{self!r} is already finished")
        self._value, self._error = value, error
        self._ack_state = _DONE
        event = self._event
        if event is not None:
            event.set()
        if self._callbacks:
            self._drain()

    def _drain(self) -> None:
        callbacks = self._callbacks
        while callbacks:
            try:
                fn = callbacks.pop(0)  # registration order, each taken once
            except IndexError:  # the other thread took the last one
                return
            try:  # _call, inlined: once per ack
                fn(self)
            except Exception:
                log.exception("exception calling callback for %r", self)

    def _call(self, fn: Callable[[Future[T]], object]) -> None:
        try:
            fn(self)
        except Exception:  # as the stock Future: a callback's bug is logged, not raised
            log.exception("exception calling callback for %r", self)


def then(first: Future[None], step: Callable[[], Future[None]]) -> Future[None]:
    """A future for ``step()`` started once ``first`` succeeded, in the thread that
    resolves ``first`` (no event-loop round trip between the two). An error of either,
    or raised by ``step``, fails the result."""
    out: AckFuture[None] = AckFuture()

    def relay(fut: Future[None]) -> None:
        exc = fut.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(None)

    def start(fut: Future[None]) -> None:
        exc = fut.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            following = step()
        except Exception as err:
            out.set_exception(err)
            return
        following.add_done_callback(relay)

    first.add_done_callback(start)
    return out


def resolved() -> AckFuture[None]:
    """An already acknowledged future (nothing to append)."""
    fut: AckFuture[None] = AckFuture()
    fut._ack_state = _DONE
    return fut
