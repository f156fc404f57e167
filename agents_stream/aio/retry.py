"""Retry strategies for async I/O calls (Flink FLIP-232 ``AsyncRetryStrategies``).

A strategy answers four questions for the operator, all pure functions of their
arguments so a retried element behaves the same after a restart:

* ``should_retry_result(results)`` / ``should_retry_exception(exc)``: is this outcome
  worth another attempt? As in Flink, an outcome is retried **only when a predicate set
  with** ``if_result`` / ``if_exception`` **matches it**; a strategy without predicates
  never retries, so ``fixed_delay(3, 0.1)`` alone changes nothing.
* ``can_retry(attempt)``: with ``attempt`` invocations done so far (1-based), may
  another one start? Flink's counting is kept: ``max_attempts`` bounds the *retries*,
  so a function is invoked at most ``1 + max_attempts`` times.
* ``backoff(attempt)``: seconds to wait after invocation number ``attempt`` failed
  before starting the next one.

When retries run out the last outcome stands: a result is emitted even if the result
predicate still matches it; an exception fails the element.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

ResultPredicate = Callable[[list[Any]], bool]
"""Receives the list of outputs of one attempt (a non-list return value ``v`` is ``[v]``)."""

ExceptionPredicate = Callable[[BaseException], bool]

ExceptionMatcher = type[BaseException] | tuple[type[BaseException], ...] | ExceptionPredicate


def _as_exception_predicate(matcher: ExceptionMatcher) -> ExceptionPredicate:
    if isinstance(matcher, (type, tuple)):
        types = matcher
        return lambda exc: isinstance(exc, types)
    return matcher


@dataclass(frozen=True, kw_only=True)
class AsyncRetryStrategy:
    """Base strategy: never retries. Subclasses define ``backoff``.

    Instances are immutable; ``if_result`` and ``if_exception`` return modified copies,
    so one strategy can be shared between operators.

    Attributes:
        max_attempts: Maximum number of retries after the first invocation.
        result_predicate: Retries an attempt whose outputs it returns True for.
        exception_predicate: Retries an attempt whose exception it returns True for.
    """

    max_attempts: int = 0
    result_predicate: ResultPredicate | None = None
    exception_predicate: ExceptionPredicate | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, got {self.max_attempts}")

    def if_result(self, predicate: ResultPredicate) -> Self:
        """Returns a copy that retries when ``predicate(outputs)`` is True.

        Args:
            predicate: Called with the list of outputs of an attempt, e.g.
                ``lambda outs: not outs`` retries empty results.
        """
        return dataclasses.replace(self, result_predicate=predicate)

    def if_exception(self, matcher: ExceptionMatcher) -> Self:
        """Returns a copy that retries exceptions matching ``matcher``.

        Args:
            matcher: An exception class, a tuple of classes, or a predicate taking the
                exception.
        """
        return dataclasses.replace(self, exception_predicate=_as_exception_predicate(matcher))

    def can_retry(self, attempt: int) -> bool:
        """True if another invocation may follow invocation number ``attempt`` (1-based)."""
        return attempt <= self.max_attempts

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after invocation number ``attempt`` before retrying it."""
        return 0.0

    def should_retry_result(self, results: Sequence[Any]) -> bool:
        """True if the result predicate is set and matches ``results``."""
        return self.result_predicate is not None and bool(self.result_predicate(list(results)))

    def should_retry_exception(self, exc: BaseException) -> bool:
        """True if the exception predicate is set and matches ``exc``."""
        return self.exception_predicate is not None and bool(self.exception_predicate(exc))


@dataclass(frozen=True, kw_only=True)
class FixedDelayRetryStrategy(AsyncRetryStrategy):
    """Waits the same ``delay`` seconds before every retry."""

    delay: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0, got {self.delay}")

    def backoff(self, attempt: int) -> float:
        """Always ``delay``."""
        return self.delay


@dataclass(frozen=True, kw_only=True)
class ExponentialBackoffRetryStrategy(AsyncRetryStrategy):
    """Waits ``initial_delay * multiplier ** (attempt - 1)`` seconds, capped at ``max_delay``.

    Unlike Flink's implementation, which keeps the last delay in a mutable field, the
    delay is computed from the attempt number alone, so it is the same after a restart
    and when one strategy object is shared by many elements.
    """

    initial_delay: float = 0.0
    max_delay: float = 0.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.initial_delay < 0:
            raise ValueError(f"initial_delay must be >= 0, got {self.initial_delay}")
        if self.max_delay < self.initial_delay:
            raise ValueError(
                f"max_delay ({self.max_delay}) must be >= initial_delay ({self.initial_delay})"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")

    def backoff(self, attempt: int) -> float:
        """``min(max_delay, initial_delay * multiplier ** (attempt - 1))`` for attempt >= 1."""
        try:
            delay = self.initial_delay * self.multiplier ** max(attempt - 1, 0)
        except OverflowError:
            # Large attempt counts overflow the float power long before max_delay matters.
            return self.max_delay
        return min(delay, self.max_delay)


NO_RETRY: AsyncRetryStrategy = AsyncRetryStrategy()
"""Never retries (Flink's ``NO_RETRY_STRATEGY``)."""


class AsyncRetryStrategies:
    """Factories for retry strategies, named after Flink's ``AsyncRetryStrategies``."""

    NO_RETRY: AsyncRetryStrategy = NO_RETRY

    @staticmethod
    def fixed_delay(max_attempts: int, delay: float) -> FixedDelayRetryStrategy:
        """A strategy retrying up to ``max_attempts`` times, ``delay`` seconds apart.

        Retries happen only for outcomes matched by ``.if_result(...)`` or
        ``.if_exception(...)`` on the returned strategy.
        """
        return FixedDelayRetryStrategy(max_attempts=max_attempts, delay=delay)

    @staticmethod
    def exponential_backoff(
        max_attempts: int, initial_delay: float, max_delay: float, multiplier: float = 2.0
    ) -> ExponentialBackoffRetryStrategy:
        """A strategy retrying up to ``max_attempts`` times with growing delays.

        The n-th retry waits ``min(max_delay, initial_delay * multiplier ** (n - 1))``
        seconds. Retries happen only for outcomes matched by ``.if_result(...)`` or
        ``.if_exception(...)`` on the returned strategy.
        """
        return ExponentialBackoffRetryStrategy(
            max_attempts=max_attempts,
            initial_delay=initial_delay,
            max_delay=max_delay,
            multiplier=multiplier,
        )


class AsyncRetryPredicates:
    """Common predicates (Flink's ``AsyncRetryPredicates``)."""

    @staticmethod
    def empty_result(results: list[Any]) -> bool:
        """Matches an attempt that produced no outputs."""
        return not results

    @staticmethod
    def has_exception(exc: BaseException) -> bool:
        """Matches any ``Exception`` (not cancellation or other ``BaseException``)."""
        return isinstance(exc, Exception)
