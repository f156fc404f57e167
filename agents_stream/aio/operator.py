"""``AsyncWaitOperator``: Flink's Async I/O operator on asyncio, independent of Kafka.

The host (the agents_stream worker, or a test) feeds elements and watermarks in input
order and receives results through callbacks. One operator runs on one event loop.

Protocol per element, in order:

1. ``process`` waits until fewer than ``capacity`` elements and watermarks are in
   flight (backpressure), puts the element in the queue and invokes ``fn``.
2. Attempts are retried on timers as the retry strategy says; the deadline
   (``timeout``) counts from the first invocation and covers every retry.
3. The first final outcome wins (a late result after the deadline is dropped).
4. When the queue lets the element out (ordered: all earlier inputs are out;
   unordered: at once, or after the preceding watermark in event time) exactly one of
   ``emit(element, outputs)`` / ``fail(element, exc)`` is awaited.
5. Only after that callback returns does the element's slot free up, so a slow sink
   backpressures ``process`` too.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigurationError
from ._invocation import AsyncFunction, CallSpec, Invocation, TimeoutHandler
from ._queue import (
    ElementQueue,
    Entry,
    OrderedQueue,
    RecordEntry,
    UnorderedQueue,
    WatermarkEntry,
)
from .errors import AsyncOperatorError, CallbackError, OperatorClosedError
from .retry import NO_RETRY, AsyncRetryStrategy

TimeMode = Literal["processing", "event"]
EmitCallback = Callable[["Element", list[Any]], Awaitable[None] | None]
FailCallback = Callable[["Element", BaseException], Awaitable[None] | None]
WatermarkCallback = Callable[[int], Awaitable[None] | None]


@dataclass(frozen=True)
class Element:
    """One input to the operator.

    Attributes:
        value: Passed to ``fn`` (and to ``on_timeout``).
        timestamp: Event time in the host's unit; carried through untouched.
        token: Opaque to the operator; the worker keeps partition/offset here to know
            which input an ``emit``/``fail`` call settles.
    """

    value: Any
    timestamp: int | None = None
    token: Any = None


class AsyncWaitOperator:
    """Runs an async function per element with bounded concurrency, as Flink's AsyncWaitOperator.

    Ordering:
        * ``ordered=True``: outputs, failures and watermarks leave in input order.
        * ``ordered=False, time_mode="processing"``: each element leaves as soon as it
          completes; a watermark is not a barrier (processing time has no event-time
          order to protect) and leaves as soon as it is dequeued.
        * ``ordered=False, time_mode="event"``: elements are reordered only between two
          watermarks. A watermark leaves after every element received before it, and no
          element received after it leaves before it.

    Failures:
        An exception from ``fn`` that the retry strategy does not retry, or the last
        one when retries run out, goes to ``fail(element, exc)``. Past the deadline the
        running attempt is cancelled and pending retries dropped; then
        ``on_timeout(value)`` supplies the outputs if given (its return value is read
        like ``fn``'s, and it may be async), else ``fail`` receives an
        :class:`AsyncIOTimeout`. In ordered mode a failure waits for its turn like a
        result. If a callback raises, the operator stops and the next ``process``,
        ``process_watermark`` or ``drain`` raises :class:`CallbackError`.

    Args:
        fn: ``async def fn(value)`` returning one output, or a list of outputs (an
            empty list emits ``emit(element, [])``, still settling the element).
        ordered: Keep input order on output.
        time_mode: ``"processing"`` or ``"event"``; matters only when unordered.
        capacity: Maximum elements plus watermarks in flight (not yet delivered).
        timeout: Seconds from the first invocation to the final outcome, retries
            included; None for no deadline.
        retry: Retry strategy; default never retries.
        on_timeout: Fallback producing outputs for a timed-out value.
        emit: Receives each settled element and its outputs.
        fail: Receives each failed element and its exception.
        emit_watermark: Receives watermarks in their place in the output order.
    """

    def __init__(
        self,
        fn: AsyncFunction,
        *,
        ordered: bool = True,
        time_mode: TimeMode = "processing",
        capacity: int = 100,
        timeout: float | None = 5.0,
        retry: AsyncRetryStrategy | None = None,
        on_timeout: TimeoutHandler | None = None,
        emit: EmitCallback,
        fail: FailCallback,
        emit_watermark: WatermarkCallback | None = None,
    ) -> None:
        if capacity < 1:
            raise ConfigurationError(f"capacity must be >= 1, got {capacity}")
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 or None, got {timeout}")
        if time_mode not in ("processing", "event"):
            raise ConfigurationError(
                f"time_mode must be 'processing' or 'event', not {time_mode!r}"
            )
        self._spec = CallSpec(
            fn=fn, retry=retry or NO_RETRY, timeout=timeout, on_timeout=on_timeout
        )
        self._capacity = capacity
        self._emit = emit
        self._fail = fail
        self._emit_watermark = emit_watermark
        self._queue: ElementQueue = (
            OrderedQueue() if ordered else UnorderedQueue(watermark_barriers=time_mode == "event")
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = 0
        self._unsettled: dict[RecordEntry, None] = {}  # insertion order == input order
        self._invocations: dict[RecordEntry, Invocation] = {}
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._drained: asyncio.Future[None] | None = None
        self._accepting = True
        self._retries_enabled = True
        self._failure: AsyncOperatorError | None = None
        self._pumping = False
        self._pump_task: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        """Elements and watermarks accepted but not yet delivered to a callback."""
        return self._in_flight

    def pending(self) -> list[Element]:
        """Elements accepted but not yet settled by ``emit``/``fail``, in input order.

        After a crash these are exactly the inputs a new operator must process again.
        """
        return [entry.element for entry in self._unsettled]

    async def process(self, element: Element) -> None:
        """Admits ``element`` and starts its first attempt; waits while the queue is full.

        Returns once the element is in flight, not when it completes.

        Raises:
            OperatorClosedError: After ``drain`` started or ``abort``.
            CallbackError: A callback raised earlier; the operator has stopped.
        """
        await self._acquire_slot()
        entry = RecordEntry(element)
        self._unsettled[entry] = None
        self._queue.put(entry)
        loop = self._loop
        assert loop is not None
        invocation = Invocation(entry, self._spec, loop, self._on_done, self._retries_allowed)
        self._invocations[entry] = invocation
        invocation.start()

    async def process_watermark(self, timestamp: int) -> None:
        """Queues a watermark; it takes a slot and is delivered in its place in the order.

        Raises:
            OperatorClosedError: After ``drain`` started or ``abort``.
            CallbackError: A callback raised earlier; the operator has stopped.
        """
        await self._acquire_slot()
        self._queue.put(WatermarkEntry(timestamp))
        self._pump()

    async def drain(self, timeout: float | None = None) -> None:
        """Stops input, fires pending retries now and waits until everything is delivered.

        Like Flink's end of input: a retry waiting for its backoff starts at once, and
        no outcome from then on is retried (it is final, result or failure). The
        operator accepts no more input afterwards.

        Args:
            timeout: Seconds to wait; None waits as long as the elements' own deadlines.

        Raises:
            TimeoutError: ``timeout`` passed first; elements stay in flight (``abort``).
            CallbackError: A callback raised; the operator has stopped.
        """
        self._raise_if_failed()
        self._stop_accepting()
        self._retries_enabled = False
        for invocation in list(self._invocations.values()):
            invocation.fire_pending_retry()
        if self._in_flight and self._loop is not None:
            if self._drained is None:
                self._drained = self._loop.create_future()
            await asyncio.wait_for(asyncio.shield(self._drained), timeout)
        self._raise_if_failed()

    def abort(self) -> list[Element]:
        """Drops everything in flight without delivering it; returns ``pending()``.

        Running attempts are cancelled, timers stopped; waiting ``process`` calls raise
        :class:`OperatorClosedError`. Use on crash-like shutdown or partition loss: the
        returned elements were not settled and must be processed again.
        """
        unsettled = self.pending()
        self._stop_accepting()
        for invocation in self._invocations.values():
            invocation.cancel()
        self._invocations.clear()
        self._unsettled.clear()
        self._queue.clear()
        if self._pump_task is not None and self._pump_task is not asyncio.current_task():
            self._pump_task.cancel()
        self._in_flight = 0
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        return unsettled

    # -- admission -------------------------------------------------------------------

    async def _acquire_slot(self) -> None:
        self._check_accepting()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        while self._in_flight >= self._capacity:
            waiter = self._loop.create_future()
            self._space_waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # A wake-up consumed by a cancelled caller is handed to the next one.
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()
                raise
            self._check_accepting()
        self._in_flight += 1

    def _check_accepting(self) -> None:
        self._raise_if_failed()
        if not self._accepting:
            raise OperatorClosedError("operator is draining or aborted; no more input")

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _stop_accepting(self) -> None:
        self._accepting = False
        while self._space_waiters:
            waiter = self._space_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(
                    self._failure or OperatorClosedError("operator is draining or aborted")
                )

    def _wake_one(self) -> None:
        while self._space_waiters:
            waiter = self._space_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _retries_allowed(self) -> bool:
        return self._retries_enabled

    # -- completion and delivery ---------------------------------------------------

    def _on_done(
        self, invocation: Invocation, results: list[Any] | None, error: BaseException | None
    ) -> None:
        entry = invocation.entry
        self._invocations.pop(entry, None)
        if entry.complete(results, error):
            self._queue.on_completed(entry)
            self._pump()

    def _pump(self) -> None:
        """Delivers every entry the queue lets out; continues in a task if a callback awaits.

        Only one delivery runs at a time, so callbacks see outputs in queue order even
        when they are coroutines.
        """
        if self._pumping or self._failure is not None:
            return
        self._pumping = True
        try:
            while (entry := self._queue.pop_completed()) is not None:
                pending = self._deliver(entry)
                if pending is not None:
                    assert self._loop is not None
                    self._pump_task = self._loop.create_task(self._pump_async(entry, pending))
                    return
                self._release(entry)
        except CallbackError as exc:
            self._stop(exc)
        self._pumping = False

    async def _pump_async(self, entry: Entry, pending: Awaitable[None]) -> None:
        try:
            while True:
                try:
                    await pending
                except Exception as exc:
                    raise _callback_error(entry) from exc
                self._release(entry)
                while True:
                    next_entry = self._queue.pop_completed()
                    if next_entry is None:
                        return
                    entry = next_entry
                    next_pending = self._deliver(entry)
                    if next_pending is not None:
                        pending = next_pending
                        break
                    self._release(entry)
        except CallbackError as exc:
            self._stop(exc)
        finally:
            self._pumping = False
            self._pump_task = None

    def _deliver(self, entry: Entry) -> Awaitable[None] | None:
        """Calls the callback for ``entry``; returns its awaitable if it is async."""
        try:
            if isinstance(entry, RecordEntry):
                if entry.error is not None:
                    result = self._fail(entry.element, entry.error)
                else:
                    result = self._emit(entry.element, entry.results)
            elif self._emit_watermark is not None:
                result = self._emit_watermark(entry.timestamp)
            else:
                return None
        except Exception as exc:
            raise _callback_error(entry) from exc
        return result if inspect.isawaitable(result) else None

    def _release(self, entry: Entry) -> None:
        if isinstance(entry, RecordEntry):
            self._unsettled.pop(entry, None)
        self._in_flight -= 1
        self._wake_one()
        if self._in_flight == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _stop(self, failure: AsyncOperatorError) -> None:
        # Set before abort() so waiting process() calls and drain() see the failure.
        self._failure = failure
        self.abort()


def _callback_error(entry: Entry) -> CallbackError:
    if isinstance(entry, RecordEntry):
        name = "fail" if entry.error is not None else "emit"
        return CallbackError(name, entry.element)
    return CallbackError("emit_watermark", entry.timestamp)
