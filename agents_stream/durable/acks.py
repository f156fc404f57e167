"""Awaiting acknowledgements: how the core waits for the journal's acks.

``asyncio.wrap_future`` wakes the event loop once per future (a self-pipe write per
journal ack). Acks arrive in bursts, one burst per producer poll, so :func:`acked`
coalesces them: the first ack of a burst schedules one loop callback that resolves every
ack that arrived meanwhile.

Where the acks come from is the host's: :class:`AckServing` is the port the core is
handed (``ContextConfig.acks``). A worker's event loop serves its producer's delivery
reports itself, between its callbacks (``kafka/producer.py``): a long synchronous stretch
of the loop (hundreds of actions started) asks it to serve the reports that are due, and
a thread that must block for an ack waits through it, since on the loop's thread nobody
else would resolve it. Other hosts have a poll thread; :data:`NO_SERVING` is theirs.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class _Waker:
    """Settles loop futures for concurrent ones resolved on other threads, one loop
    callback per burst.

    No lock: the threads resolving acks (the producer's poll thread, code-block threads)
    would share it with the loop, and one of them preempted while holding it (every GIL
    switch interval) blocked the loop until it got the GIL back. Instead ``_ready`` is
    never replaced (appends and ``popleft`` are atomic under the GIL), and the loop clears
    ``_scheduled`` *before* draining: an arrival either lands in the deque before the
    drain empties it, or sees the flag cleared and schedules another drain."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ready: deque[tuple[asyncio.Future[Any], Future[Any]]] = deque()
        self._scheduled = False

    def wrap(self, fut: Future[T]) -> asyncio.Future[T]:
        waiter: asyncio.Future[T] = self._loop.create_future()
        if fut.done():
            _settle(waiter, fut)
        else:
            fut.add_done_callback(lambda f: self._arrived(waiter, f))
        return waiter

    def _arrived(self, waiter: asyncio.Future[Any], fut: Future[Any]) -> None:
        self._ready.append((waiter, fut))
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # loop closed: nobody is waiting any more
            pass

    def _flush(self) -> None:
        self._scheduled = False
        ready = self._ready
        while ready:
            try:
                waiter, fut = ready.popleft()
            except IndexError:
                return
            _settle(waiter, fut)


def _settle(waiter: asyncio.Future[T], fut: Future[T]) -> None:
    if waiter.done():
        return
    exc = fut.exception()
    if exc is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(fut.result())


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waker] = weakref.WeakKeyDictionary()


_last: _Waker | None = None  # the last loop's waker: one loop per process, nearly always


def acked(fut: Future[T]) -> asyncio.Future[T]:
    """An awaitable for ``fut`` on the running loop (resolved in per-burst batches)."""
    global _last
    loop = asyncio.get_running_loop()
    waker = _last
    if waker is None or waker._loop is not loop:
        # A weak-keyed lookup builds a weak reference per call: only on a loop change.
        waker = _wakers.get(loop)
        if waker is None:
            waker = _wakers[loop] = _Waker(loop)
        _last = waker
    return waker.wrap(fut)


class AckServing(Protocol):
    """Where delivery reports are served, as the core needs it."""

    def serve_due(self) -> None:
        """Between two pieces of a long synchronous stretch: serve the reports that are
        due if this thread is the one serving them (else nothing)."""

    def wait(self, fut: Future[T], timeout: float | None = None) -> T:
        """Block this thread until ``fut`` is resolved (serving the reports meanwhile if
        this thread is the one serving them); its result, or raise its exception."""


class _NoServing:
    """Reports served by a thread of their own: nothing to serve here, a plain wait."""

    def serve_due(self) -> None:
        pass

    def wait(self, fut: Future[T], timeout: float | None = None) -> T:
        return fut.result(timeout)


NO_SERVING: AckServing = _NoServing()
