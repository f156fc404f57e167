"""User-facing call descriptions: DurableCallable and RetryPolicy."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

R = TypeVar("R")


class DurableCallable(Generic[R]):
    """A call with an explicit stable identity, for ``ctx.execute(DurableCallable)``.

    Subclasses set ``id`` (stable across deploys, used instead of module + qualname to
    match journal slots) and implement ``call()``; implementing ``reconciler()`` makes
    the call *reconcilable*: PENDING is journaled and acknowledged before ``call()``
    starts, and after a crash with the slot still PENDING, ``reconciler()`` (never
    ``call()``) determines the outcome, e.g. by asking the payment API whether the
    charge with this call's idempotency key went through.

    If ``call``/``reconciler`` take a first parameter named ``call_id`` they receive the
    slot's stable call id. ``DurableCallable[Receipt]`` types what ``ctx.execute``
    returns for it.
    """

    id: str = ""

    def call(self, *args: Any, **kwargs: Any) -> R:
        raise NotImplementedError

    def reconciler(self, *args: Any, **kwargs: Any) -> R:
        raise NotImplementedError

    @property
    def has_reconciler(self) -> bool:
        return type(self).reconciler is not DurableCallable.reconciler

    @property
    def function_id(self) -> str:
        return self.id or f"{type(self).__module__}.{type(self).__qualname__}"


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Retry a code block in place; only the final outcome is journaled.

    Attributes:
        max_attempts: total attempts including the first.
        backoff: ``"fixed"`` waits ``initial_delay`` each time; ``"exponential"`` doubles
            (times ``multiplier``) up to ``max_delay``.
        retry_on: exception types, or a predicate on the exception, that are retried;
            anything else fails at once.
        jitter: fraction of the delay added at random, so retrying workers spread out.
    """

    max_attempts: int = 3
    backoff: Literal["fixed", "exponential"] = "exponential"
    initial_delay: float = 0.1
    max_delay: float = 10.0
    multiplier: float = 2.0
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool] = (Exception,)
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        if attempt >= self.max_attempts:
            return False
        if isinstance(self.retry_on, tuple):
            return isinstance(exc, self.retry_on)
        return bool(self.retry_on(exc))

    def delay(self, attempt: int) -> float:
        """Delay before attempt ``attempt + 1`` (attempts count from 1)."""
        if self.backoff == "fixed":
            base = self.initial_delay
        else:
            base = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        return base * (1 + random.random() * self.jitter) if self.jitter else base
