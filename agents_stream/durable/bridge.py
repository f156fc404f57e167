"""Sync action bodies on the event loop, suspended (not blocked) while they wait.

A sync action that calls ``ctx.execute`` must wait for its CallResult's ack before the
call returns (guarantee 1). Run on a thread, every waiting record holds a thread, so a
fixed pool caps the records in flight at its size and throughput at ``pool / ack
latency``. Here the body runs in a greenlet on the loop thread instead: at each wait
(:func:`await_`) the greenlet switches back to the asyncio task driving it, which awaits
the ack like an async action would, then switches back in. Thousands of sync actions can
wait at once; none holds a thread.

What runs where: the action body (between code blocks) on the loop thread; the body of a
code block in the host's thread pool (it may block on I/O); acks on the loop.

Async actions get the same for the sync ``ctx.execute`` they may call (the public
contract's own example does, for a quick computation): :func:`run_coroutine_bridged`
drives the action's coroutine in a carrier as its task would, waiting for each future
it yields. The call still runs inline (it is meant to be quick), but its ack wait
suspends the carrier instead of blocking the loop, where before every other record of
the worker stood still for each such call's ack (a few ms on a real cluster).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from greenlet import GreenletExit, getcurrent, greenlet

from .acks import acked

T = TypeVar("T")


class Carrier(greenlet):  # type: ignore[misc]
    """A greenlet running a sync action (or an async one's coroutine: ``stepping``);
    ``driver`` is the greenlet that switched to it (the asyncio task's), which it
    switches back to when it waits or is done."""

    def __init__(self, fn: Callable[..., Any], driver: greenlet) -> None:
        super().__init__(fn, driver)
        self.driver = driver
        self.stepping = False

    def wait(self, awaitable: Awaitable[T] | Future[T]) -> T:
        """:func:`await_` for a caller that holds its carrier already (``carrier()``):
        called from inside this greenlet only."""
        return self.driver.switch(awaitable)  # type: ignore[no-any-return]


class Finished:
    """What a carrier switches back with once its action returned or raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error

    def take(self) -> tuple[Any, BaseException | None]:
        """The outcome, once: the idle carrier's frame still holds this object, which
        must not keep the action's result or traceback (and its context) alive."""
        value, error = self.value, self.error
        self.value = self.error = None
        return value, error

    def unwrap(self) -> Any:
        value, error = self.take()
        if error is not None:
            raise error
        return value


def _carry() -> None:
    """Body of a carrier: runs one action after another. Starting a greenlet costs about
    ten times switching into a live one, and every sync action needs one."""
    me = getcurrent()
    # Work arrives by switches, never as arguments of the first one: the greenlet would
    # hold those for as long as this body runs (the first action's event and ctx).
    fn, args = me.driver.switch(None)
    while True:
        try:
            out = Finished(fn(*args), None)
        except GreenletExit:
            raise  # abandoned while waiting: this carrier ends here
        except BaseException as exc:
            out = Finished(None, exc)
        fn = args = None  # an idle carrier must not keep the last action's event and ctx
        fn, args = me.driver.switch(out)


_idle = threading.local()
# Carriers kept per thread for reuse. As many run at once as actions wait at once (up
# to the in-flight limit); the ones beyond this are ended when released, not left
# suspended (a suspended greenlet is never collected).
MAX_IDLE = 1024


def start(
    fn: Callable[..., Any], args: tuple[Any, ...], context: contextvars.Context
) -> tuple[Carrier, Any]:
    """Run ``fn(*args)`` in a carrier greenlet of this thread, with ``context`` (a
    greenlet starts with an empty one; a thread would see its caller's). Returns the
    carrier and either a :class:`Finished` or the awaitable the action waits for: resume
    it with ``carrier.switch(result)`` / ``carrier.throw(exc)``, which return the same,
    and give it back with :func:`release` once finished."""
    driver = getcurrent()
    pool: list[Carrier] | None = getattr(_idle, "pool", None)
    if pool:
        carrier = pool.pop()
        carrier.driver = driver
    else:
        carrier = Carrier(_carry, driver)
        carrier.switch()  # to its first wait for work
    carrier.gr_context = context
    carrier.stepping = False
    return carrier, carrier.switch(fn, args)


def release(carrier: Carrier) -> None:
    """A carrier whose action finished, for the next action of this thread."""
    pool: list[Carrier] | None = getattr(_idle, "pool", None)
    if pool is None:
        pool = _idle.pool = []
    if carrier.dead:
        return
    carrier.gr_context = None
    if len(pool) < MAX_IDLE:
        pool.append(carrier)
    else:
        carrier.throw(GreenletExit())  # ends its loop; control comes straight back


async def run_bridged(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on this loop's thread; :func:`await_` inside it suspends it."""
    carrier, step = start(fn, args, contextvars.copy_context())
    while type(step) is not Finished:
        try:
            value = await (acked(step) if isinstance(step, Future) else step)
        except BaseException as exc:  # delivered into the action, which may handle it
            step = carrier.throw(exc)
        else:
            step = carrier.switch(value)
    release(carrier)
    return step.unwrap()  # type: ignore[no-any-return]


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """In a carrier: run ``coro`` to its end as its task would, waiting (:func:`await_`)
    for each future it yields; a sync call inside it waits the same way."""
    getcurrent().stepping = True
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            out = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as stop:
            return stop.value
        value = error = None
        try:
            if out is None:  # a bare yield (asyncio.sleep(0)): let the loop run once
                await_(asyncio.sleep(0))
            elif getattr(out, "_asyncio_future_blocking", None):
                out._asyncio_future_blocking = False
                await_(out)
            else:
                error = RuntimeError(f"Task got bad yield: {out!r}")
        except GreenletExit:
            raise  # the carrier is abandoned (a drain): the coroutine is closed below
        except BaseException as exc:
            if not _own_outcome(out, exc):
                error = exc  # e.g. the task cancelled after the future was done


async def run_coroutine_bridged(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` inside a carrier, so a sync call inside it may :func:`await_`
    (suspend) instead of blocking the loop.

    The task running this is the coroutine's task, as if it awaited ``coro`` directly:
    ``asyncio.current_task()``, ``asyncio.timeout()`` and cancellation act on it, a
    future the coroutine yields is what the task waits on (so a cancel reaches it), and
    the coroutine reads that future's outcome itself when resumed, as under a Task.
    Its context variables live in a copy of the caller's context, as a task's do.
    """
    try:
        return await run_bridged(_drive, coro)
    finally:
        coro.close()  # a no-op once it returned or raised


def _own_outcome(fut: Any, exc: BaseException) -> bool:
    """Whether ``exc`` is ``fut``'s own outcome, which the coroutine reads when resumed."""
    if not asyncio.isfuture(fut) or not fut.done():
        return False
    if fut.cancelled():
        return isinstance(exc, asyncio.CancelledError)
    return fut.exception() is exc


def stepping() -> bool:
    """Whether the caller runs inside :func:`run_coroutine_bridged` (an async action:
    its sync calls run inline, only their waits suspend)."""
    current = getcurrent()
    return isinstance(current, Carrier) and current.stepping


def carrier() -> Carrier | None:
    """The carrier greenlet the caller runs in (``stepping`` tells an async action's),
    or None: one lookup where a call asks both :func:`bridged` and :func:`stepping`."""
    current = getcurrent()
    return current if isinstance(current, Carrier) else None


def bridged() -> bool:
    """Whether the caller runs inside :func:`run_bridged` (may call :func:`await_`)."""
    return isinstance(getcurrent(), Carrier)


def await_(awaitable: Awaitable[T] | Future[T]) -> T:
    """Suspend the bridged sync function until ``awaitable`` is done; its result.

    A ``concurrent.futures.Future`` (a journal ack, a code block's result) is handed to
    the driver as it is: a batch waits for it without an asyncio future per wait.

    Raises:
        RuntimeError: not called from inside :func:`run_bridged`.
    """
    current = getcurrent()
    if not isinstance(current, Carrier):
        raise RuntimeError("await_() outside a bridged sync action")
    return current.driver.switch(awaitable)  # type: ignore[no-any-return]
