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
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from greenlet import getcurrent, greenlet

T = TypeVar("T")


class _Bridged(greenlet):  # type: ignore[misc]
    """A greenlet running a sync action; ``driver`` is the asyncio task's greenlet."""

    def __init__(self, fn: Callable[..., Any], driver: greenlet) -> None:
        super().__init__(fn, driver)
        self.driver = driver


async def run_bridged(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on this loop's thread; :func:`await_` inside it suspends it."""
    child = _Bridged(fn, getcurrent())
    # A greenlet starts with an empty context: give it the caller's, as a thread would.
    child.gr_context = contextvars.copy_context()
    step = child.switch(*args)
    while not child.dead:
        try:
            value = await step
        except BaseException as exc:  # delivered into the action, which may handle it
            step = child.throw(exc)
        else:
            step = child.switch(value)
    return step  # type: ignore[no-any-return]


def bridged() -> bool:
    """Whether the caller runs inside :func:`run_bridged` (may call :func:`await_`)."""
    return isinstance(getcurrent(), _Bridged)


def await_(awaitable: Awaitable[T]) -> T:
    """Suspend the bridged sync function until ``awaitable`` is done; its result.

    Raises:
        RuntimeError: not called from inside :func:`run_bridged`.
    """
    current = getcurrent()
    if not isinstance(current, _Bridged):
        raise RuntimeError("await_() outside a bridged sync action")
    return current.driver.switch(awaitable)  # type: ignore[no-any-return]
