"""CodeBlockPool: the threads that run code blocks, cheap per call.

A code block of a sync action may block on I/O, so it runs on a thread while its action
waits on the event loop. ``loop.run_in_executor`` over a ``ThreadPoolExecutor`` costs a
stock Future (with its Condition), a work item, a second future chained onto the loop
and one loop wake-up per result; with one hop per journaled call that was a large share
of a record's CPU. Here a call is one queue put, one :class:`AckFuture`, and results
reach the loop through :func:`~agents_stream.durable.acks.acked`, which wakes the loop
once per burst of results rather than once per result.

It is also a ``concurrent.futures.Executor`` (``submit``/``shutdown``), so hosts can pass
it wherever an executor is expected (``execute_async`` of plain functions).

Its size caps how many code blocks run at once (``App(code_block_threads)``): a sync
action whose calls take 50 ms cannot finish more than ``threads / 0.05`` records a
second, whatever the in-flight limit. A full pool is therefore logged (once a minute)
and counted, so an operator sees the cap before guessing at it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Executor, Future
from typing import Any, TypeVar

from ..ackfuture import AckFuture
from .acks import acked

T = TypeVar("T")

_STOP = object()
log = logging.getLogger("agents_stream.worker")
WARN_EVERY_S = 60.0


class CodeBlockPool(Executor):
    """Up to ``max_workers`` daemon threads, started as work arrives."""

    def __init__(
        self, max_workers: int = 64, thread_name_prefix: str = "agents-stream-action"
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._outstanding = 0  # submitted, not finished: more than threads -> one more
        self._closed = False
        self.waited = 0  # code blocks submitted while every thread was busy
        self._warned = -WARN_EVERY_S

    @property
    def max_workers(self) -> int:
        return self._max

    @property
    def threads(self) -> int:
        """Threads started so far (they start as work arrives and then stay)."""
        return len(self._threads)

    @property
    def running(self) -> int:
        """Code blocks running now."""
        return min(self._outstanding, len(self._threads))

    @property
    def waiting(self) -> int:
        """Code blocks queued for a thread: the pool is the bottleneck while this is > 0."""
        return max(0, self._outstanding - len(self._threads))

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut: AckFuture[T] = AckFuture()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._outstanding += 1
            if self._outstanding > len(self._threads):
                if len(self._threads) < self._max:
                    self._start_thread()
                else:
                    self.waited += 1
                    self._saturated()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def _saturated(self) -> None:
        now = time.monotonic()
        if now - self._warned < WARN_EVERY_S:
            return
        self._warned = now
        log.warning(
            "all %d code-block threads are busy (%d code blocks wait for one): slow calls "
            "of sync actions are capped at %d at a time; raise App(code_block_threads) / "
            "--code-block-threads, or make the action async with coroutine code blocks",
            self._max,
            self._outstanding - len(self._threads),
            self._max,
        )

    def run(self, fn: Callable[..., T], /, *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on a pool thread, awaitable on the running loop."""
        return acked(self.submit(fn, *args))

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._prefix}_{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fut, fn, args, kwargs = item
            error: BaseException | None = None
            result = None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # delivered to the waiter, as an executor does
                error = exc
            # Counted finished before the waiter hears of it: an action resumed by this
            # result may submit its next call at once, and this thread is free for it.
            with self._lock:
                self._outstanding -= 1
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
            del item, fut, fn, args, kwargs, result, error  # nothing of a call outlives it

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[0].set_exception(CancelledError())
        for _ in threads:
            self._queue.put(_STOP)
        if wait:
            for thread in threads:
                thread.join()
