"""Retry strategies: pure backoff, attempt bounds, predicates, immutability."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents_stream.aio import (
    NO_RETRY,
    AsyncRetryPredicates,
    AsyncRetryStrategies,
    ExponentialBackoffRetryStrategy,
    FixedDelayRetryStrategy,
)


def test_fixed_delay_backoff_is_constant():
    strategy = AsyncRetryStrategies.fixed_delay(3, 0.5)
    assert isinstance(strategy, FixedDelayRetryStrategy)
    assert [strategy.backoff(n) for n in (1, 2, 3, 10)] == [0.5, 0.5, 0.5, 0.5]


def test_exponential_backoff_grows_and_is_capped():
    strategy = AsyncRetryStrategies.exponential_backoff(10, 0.1, 1.0, 2.0)
    assert isinstance(strategy, ExponentialBackoffRetryStrategy)
    delays = [strategy.backoff(n) for n in range(1, 7)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_exponential_backoff_survives_huge_attempt_numbers():
    strategy = AsyncRetryStrategies.exponential_backoff(10**9, 0.1, 30.0, 10.0)
    assert strategy.backoff(100_000) == 30.0


@given(
    attempt=st.integers(1, 500),
    initial=st.floats(0, 10),
    extra=st.floats(0, 100),
    multiplier=st.floats(1, 10),
)
def test_exponential_backoff_is_pure_monotone_and_bounded(attempt, initial, extra, multiplier):
    strategy = AsyncRetryStrategies.exponential_backoff(5, initial, initial + extra, multiplier)
    delay = strategy.backoff(attempt)
    assert initial <= delay <= initial + extra or delay == pytest.approx(initial)
    assert strategy.backoff(attempt + 1) >= delay
    assert strategy.backoff(attempt) == delay  # no hidden state


def test_can_retry_counts_retries_after_the_first_attempt():
    strategy = AsyncRetryStrategies.fixed_delay(2, 0)
    assert [strategy.can_retry(n) for n in (1, 2, 3)] == [True, True, False]
    assert not NO_RETRY.can_retry(1)
    assert AsyncRetryStrategies.NO_RETRY is NO_RETRY


def test_nothing_is_retried_without_a_predicate():
    strategy = AsyncRetryStrategies.fixed_delay(5, 0)
    assert not strategy.should_retry_result([])
    assert not strategy.should_retry_exception(ConnectionError())


def test_predicates_are_fluent_and_return_new_frozen_objects():
    base = AsyncRetryStrategies.exponential_backoff(3, 0.1, 1.0)
    on_empty = base.if_result(AsyncRetryPredicates.empty_result)
    both = on_empty.if_exception(AsyncRetryPredicates.has_exception)
    assert base.result_predicate is None and base.exception_predicate is None
    assert type(both) is type(base) and both.max_attempts == 3 and both.max_delay == 1.0
    assert both.should_retry_result([]) and not both.should_retry_result([1])
    assert both.should_retry_exception(ValueError())
    assert not both.should_retry_exception(KeyboardInterrupt())
    with pytest.raises(dataclasses.FrozenInstanceError):
        both.max_attempts = 9  # type: ignore[misc]


def test_if_exception_accepts_classes_and_tuples():
    by_class = NO_RETRY.if_exception(ConnectionError)
    by_tuple = NO_RETRY.if_exception((KeyError, TimeoutError))
    assert by_class.should_retry_exception(ConnectionResetError())
    assert not by_class.should_retry_exception(KeyError())
    assert by_tuple.should_retry_exception(KeyError()) and by_tuple.should_retry_exception(
        TimeoutError()
    )
    assert not by_tuple.should_retry_exception(ValueError())


def test_result_predicate_receives_the_outputs_list():
    seen = []
    strategy = AsyncRetryStrategies.fixed_delay(1, 0).if_result(lambda out: seen.append(out))
    strategy.should_retry_result((1, 2))
    assert seen == [[1, 2]]


@pytest.mark.parametrize(
    "make",
    [
        lambda: AsyncRetryStrategies.fixed_delay(-1, 0),
        lambda: AsyncRetryStrategies.fixed_delay(1, -0.1),
        lambda: AsyncRetryStrategies.exponential_backoff(1, -1, 1),
        lambda: AsyncRetryStrategies.exponential_backoff(1, 2, 1),
        lambda: AsyncRetryStrategies.exponential_backoff(1, 0.1, 1, 0.5),
    ],
)
def test_invalid_strategies_are_rejected(make):
    with pytest.raises(ValueError):
        make()
