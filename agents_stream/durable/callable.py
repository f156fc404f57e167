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


class TwoPhaseCommitCallable(Generic[R]):
    """A call to an external system in two phases, for ``ctx.execute(TwoPhaseCommitCallable)``.

    ``prepare()`` runs as a code block: its result is journaled (a PREPARED obligation
    beside the call's slot) and acknowledged before the action sees it, and replayed
    after a crash, never prepared again. ``commit(prepared)`` runs once the completion of
    the action that made the call is durable (exactly-once: its transaction committed),
    off the record path, retried until it returns; ``abort(prepared)`` runs when the
    record will never complete with that preparation (the action raised and the record
    was dead-lettered or dropped, a replay diverged from the slot, the record was
    skipped by an offset reset). Both run again after a crash until their return is
    journaled, so **commit and abort must be idempotent**; ``prepare`` should be too,
    keyed by its ``call_id``, as any call that may run again before its result is
    journaled.

    Subclass it with a dataclass: its fields are the call's identity (digested, as a
    call's arguments) and are journaled with the obligation, so that the partition's
    next owner can commit or abort it. Its class must be importable where the app is
    (module level), and the fields in the journaled value domain. ``id`` (optional) is a
    stable name used instead of ``module.QualName``. A ``call_id`` first parameter of
    ``prepare``/``commit``/``abort`` receives the call's id (a slot prepared afresh after
    an abort gets ``<call id>~<round>``)::

        @dataclass
        class Charge(TwoPhaseCommitCallable[dict]):
            order: str
            cents: int

            def prepare(self, call_id):
                return {"hold": psp.authorize(self.order, self.cents, key=call_id)}

            def commit(self, prepared):
                psp.capture(prepared["hold"])

            def abort(self, prepared):
                psp.release(prepared["hold"])

        prepared = ctx.execute(Charge(order, 1999))
    """

    id: str = ""

    def prepare(self, *args: Any, **kwargs: Any) -> R:
        raise NotImplementedError

    def commit(self, prepared: R, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def abort(self, prepared: R, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    @property
    def function_id(self) -> str:
        return self.id or f"{type(self).__module__}.{type(self).__qualname__}"
