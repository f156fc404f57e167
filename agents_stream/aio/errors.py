"""Errors of the async I/O operator; each names the element and attempt count involved."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import AgentsStreamError

if TYPE_CHECKING:
    from .operator import Element


class AsyncOperatorError(AgentsStreamError):
    """Base of async I/O operator errors."""


class AsyncIOTimeout(AsyncOperatorError, TimeoutError):
    """An element did not complete within the operator's timeout, retries included.

    It is also a ``TimeoutError`` (hence an ``asyncio.TimeoutError`` on Python >= 3.11),
    so handlers written for plain asyncio timeouts still catch it.

    Attributes:
        element: The element that timed out (its ``token`` tells the worker which record).
        timeout: The total deadline in seconds, counted from the first invocation.
        attempts: How many times the function was invoked before the deadline.
    """

    def __init__(self, element: Element, *, timeout: float, attempts: int) -> None:
        super().__init__(
            f"async call timed out after {timeout:g}s and {attempts} attempt(s) "
            f"(token={element.token!r})"
        )
        self.element = element
        self.timeout = timeout
        self.attempts = attempts


class OperatorClosedError(AsyncOperatorError):
    """``process`` or ``process_watermark`` was called after ``drain``/``abort``."""


class CallbackError(AsyncOperatorError):
    """An ``emit``/``fail``/``emit_watermark`` callback raised; the operator stopped.

    The callback's exception is chained as ``__cause__``. No further output is delivered:
    like a failed Flink task, the host is expected to discard the operator and restart
    from its last committed input position.

    Attributes:
        callback: Name of the callback that raised (``"emit"``, ``"fail"`` or
            ``"emit_watermark"``).
        item: The element (or watermark timestamp) being delivered.
    """

    def __init__(self, callback: str, item: Any) -> None:
        super().__init__(f"{callback} callback raised while delivering {item!r}")
        self.callback = callback
        self.item = item
