"""One element's life in the operator: attempts, retry timers and the total deadline.

Everything here is callback-driven on the event loop: an attempt is a task with a done
callback, a retry is a ``loop.call_later`` handle and the deadline is another. No task
sleeps on behalf of an element, so thousands of elements waiting for a retry cost only
timer handles.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._queue import RecordEntry
from .errors import AsyncIOTimeout
from .retry import AsyncRetryStrategy

AsyncFunction = Callable[[Any], Awaitable[Any]]
TimeoutHandler = Callable[[Any], Any]
DoneCallback = Callable[["Invocation", list[Any] | None, BaseException | None], None]


@dataclass(frozen=True)
class CallSpec:
    """How every element of one operator is called."""

    fn: AsyncFunction
    retry: AsyncRetryStrategy
    timeout: float | None
    on_timeout: TimeoutHandler | None


def as_outputs(value: Any) -> list[Any]:
    """A list is several outputs; anything else is one."""
    return value if isinstance(value, list) else [value]


class Invocation:
    """Calls ``spec.fn`` for one entry until an outcome is final, then reports it once.

    The outcome is final when an attempt's result or exception is not retried (no
    predicate matches, attempts exhausted, or retries disabled by a drain), when the
    deadline fires, or after ``cancel``. ``done`` is called at most once.
    """

    __slots__ = (
        "_done",
        "_finished",
        "_loop",
        "_retries_allowed",
        "_retry_handle",
        "_spec",
        "_task",
        "_timeout_handle",
        "attempts",
        "entry",
    )

    def __init__(
        self,
        entry: RecordEntry,
        spec: CallSpec,
        loop: asyncio.AbstractEventLoop,
        done: DoneCallback,
        retries_allowed: Callable[[], bool],
    ) -> None:
        self.entry = entry
        self.attempts = 0
        self._spec = spec
        self._loop = loop
        self._done = done
        self._retries_allowed = retries_allowed
        self._finished = False
        self._task: asyncio.Future[Any] | None = None
        self._retry_handle: asyncio.TimerHandle | None = None
        self._timeout_handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Starts the deadline (if any) and the first attempt."""
        if self._spec.timeout is not None:
            self._timeout_handle = self._loop.call_later(self._spec.timeout, self._on_timeout)
        self._attempt()

    def fire_pending_retry(self) -> None:
        """Runs a scheduled retry now instead of after its backoff (used by drain)."""
        if self._retry_handle is not None and not self._finished:
            self._retry_handle.cancel()
            self._attempt()

    def cancel(self) -> None:
        """Stops timers and the running attempt without reporting an outcome."""
        self._finished = True
        self._stop_activity()
        if self._timeout_handle is not None:
            self._timeout_handle.cancel()

    def _stop_activity(self) -> None:
        if self._retry_handle is not None:
            self._retry_handle.cancel()
            self._retry_handle = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    def _attempt(self) -> None:
        self._retry_handle = None
        self.attempts += 1
        try:
            awaitable = self._spec.fn(self.entry.element.value)
        except Exception as exc:
            self._on_outcome(None, exc)
            return
        if not inspect.isawaitable(awaitable):
            self._on_outcome(as_outputs(awaitable), None)
            return
        task = asyncio.ensure_future(awaitable, loop=self._loop)
        self._task = task
        task.add_done_callback(self._on_attempt_done)

    def _on_attempt_done(self, task: asyncio.Future[Any]) -> None:
        # A task we replaced or cancelled (timeout, abort) must not complete the entry.
        if task is not self._task or self._finished:
            _discard(task)
            return
        self._task = None
        results, error = _outcome(task)
        self._on_outcome(results, error)

    def _on_outcome(self, results: list[Any] | None, error: BaseException | None) -> None:
        try:
            retry = self._should_retry(results, error)
        except Exception as exc:
            # A broken predicate fails the element rather than the whole operator.
            self._finish(None, exc)
            return
        if not retry:
            self._finish(results, error)
            return
        delay = self._spec.retry.backoff(self.attempts)
        self._retry_handle = self._loop.call_later(delay, self._attempt)

    def _should_retry(self, results: list[Any] | None, error: BaseException | None) -> bool:
        strategy = self._spec.retry
        if not self._retries_allowed() or not strategy.can_retry(self.attempts):
            return False
        if error is not None:
            return strategy.should_retry_exception(error)
        return strategy.should_retry_result(results or [])

    def _on_timeout(self) -> None:
        self._timeout_handle = None
        if self._finished:
            return
        # The deadline covers all attempts: whatever is running or scheduled is dropped.
        self._stop_activity()
        handler = self._spec.on_timeout
        if handler is None:
            timeout = self._spec.timeout or 0.0
            error = AsyncIOTimeout(self.entry.element, timeout=timeout, attempts=self.attempts)
            self._finish(None, error)
            return
        try:
            fallback = handler(self.entry.element.value)
        except Exception as exc:
            self._finish(None, exc)
            return
        if not inspect.isawaitable(fallback):
            self._finish(as_outputs(fallback), None)
            return
        task = asyncio.ensure_future(fallback, loop=self._loop)
        self._task = task
        task.add_done_callback(self._on_fallback_done)

    def _on_fallback_done(self, task: asyncio.Future[Any]) -> None:
        if task is not self._task or self._finished:
            _discard(task)
            return
        self._task = None
        self._finish(*_outcome(task))

    def _finish(self, results: list[Any] | None, error: BaseException | None) -> None:
        if self._finished:
            return
        self._finished = True
        if self._timeout_handle is not None:
            self._timeout_handle.cancel()
            self._timeout_handle = None
        self._done(self, results, error)


def _outcome(task: asyncio.Future[Any]) -> tuple[list[Any] | None, BaseException | None]:
    if task.cancelled():
        # Cancelled by someone other than this invocation (it drops its own first).
        return None, asyncio.CancelledError()
    error = task.exception()
    if error is not None:
        return None, error
    return as_outputs(task.result()), None


def _discard(task: asyncio.Future[Any]) -> None:
    # Retrieving the exception of an ignored late attempt keeps asyncio from logging
    # "exception was never retrieved" for an outcome that lost the race on purpose.
    if not task.cancelled():
        task.exception()
