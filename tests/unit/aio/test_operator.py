"""AsyncWaitOperator behaviour, after Flink's AsyncWaitOperatorTest.

Every test runs its own event loop with ``asyncio.run``; latencies are milliseconds.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from agents_stream.aio import (
    AsyncIOTimeout,
    AsyncRetryStrategies,
    AsyncWaitOperator,
    CallbackError,
    Element,
    OperatorClosedError,
)
from agents_stream.errors import ConfigurationError

from .fixtures import Recorder, sleeper

MS = 0.001


async def feed(op: AsyncWaitOperator, items: list[Any]) -> None:
    """Processes ints as elements (timestamp = value) and ``("wm", ts)`` as watermarks."""
    for item in items:
        if isinstance(item, tuple):
            await op.process_watermark(item[1])
        else:
            await op.process(Element(item, timestamp=item, token=("p0", item)))


async def settle(op: AsyncWaitOperator, limit: float = 2.0) -> None:
    """Waits until nothing is in flight without draining (drain would stop retries)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while op.in_flight and loop.time() < deadline:
        await asyncio.sleep(MS)
    assert op.in_flight == 0


# -- ordering ----------------------------------------------------------------------


@pytest.mark.parametrize("time_mode", ["processing", "event"])
def test_ordered_emits_in_input_order(operator_factory, time_mode):
    delays = {i: (10 - i) * MS for i in range(10)}  # later inputs complete first
    op, rec = operator_factory(sleeper(delays), ordered=True, time_mode=time_mode)

    async def main():
        await feed(op, [0, 1, 2, ("wm", 2), 3, 4, 5, 6, ("wm", 6), 7, 8, 9])
        await op.drain()

    asyncio.run(main())
    assert [(k, v) for k, v, _ in rec.log] == [
        *[("emit", i) for i in range(3)],
        ("wm", 2),
        *[("emit", i) for i in range(3, 7)],
        ("wm", 6),
        *[("emit", i) for i in range(7, 10)],
    ]
    assert rec.outputs == {i: [i * 10] for i in range(10)}


def test_unordered_processing_time_emits_as_completed(operator_factory):
    delays = {i: (10 - i) * 2 * MS for i in range(10)}
    op, rec = operator_factory(sleeper(delays), ordered=False, time_mode="processing")

    async def main():
        await feed(op, list(range(10)))
        await op.drain()

    asyncio.run(main())
    assert rec.values == list(reversed(range(10)))


def test_unordered_processing_time_watermark_is_not_a_barrier(operator_factory):
    op, rec = operator_factory(sleeper({0: 20 * MS}), ordered=False, time_mode="processing")

    async def main():
        await feed(op, [0, ("wm", 0), 1])
        await op.drain()

    asyncio.run(main())
    assert [(k, v) for k, v, _ in rec.log] == [("wm", 0), ("emit", 1), ("emit", 0)]


def test_unordered_event_time_reorders_only_within_watermark_segments(operator_factory):
    # Within each segment the first input is slowest; across segments the later one is
    # faster, so only the watermark barrier keeps segments apart.
    delays = {0: 30 * MS, 1: 20 * MS, 2: 1 * MS, 3: 15 * MS, 4: 1 * MS, 5: 0.0}
    op, rec = operator_factory(sleeper(delays), ordered=False, time_mode="event")

    async def main():
        await feed(op, [0, 1, 2, ("wm", 2), 3, 4, ("wm", 4), 5])
        await op.drain()

    asyncio.run(main())
    assert [(k, v) for k, v, _ in rec.log] == [
        ("emit", 2),
        ("emit", 1),
        ("emit", 0),
        ("wm", 2),
        ("emit", 4),
        ("emit", 3),
        ("wm", 4),
        ("emit", 5),
    ]


def test_event_time_consecutive_watermarks_and_empty_segments(operator_factory):
    op, rec = operator_factory(sleeper({}), ordered=False, time_mode="event")

    async def main():
        await feed(op, [("wm", 1), ("wm", 2), 7, ("wm", 3)])
        await op.drain()

    asyncio.run(main())
    assert [(k, v) for k, v, _ in rec.log] == [("wm", 1), ("wm", 2), ("emit", 7), ("wm", 3)]


def test_elements_keep_timestamp_and_token(operator_factory):
    seen: list[Element] = []
    op, _ = operator_factory(sleeper({}), emit=lambda e, out: seen.append(e))

    async def main():
        await op.process(Element("x", timestamp=42, token=("topic", 3, 17)))
        await op.drain()

    asyncio.run(main())
    assert seen == [Element("x", timestamp=42, token=("topic", 3, 17))]


def test_list_result_is_several_outputs_and_empty_list_still_settles(operator_factory):
    async def fn(value):
        return list(range(value))

    op, rec = operator_factory(fn)

    async def main():
        await feed(op, [0, 3])
        await op.drain()

    asyncio.run(main())
    assert rec.log == [("emit", 0, []), ("emit", 3, [0, 1, 2])]


# -- failures and timeouts -----------------------------------------------------------


def test_exception_fails_element_in_order(operator_factory):
    async def fn(value):
        if value == 1:
            raise ValueError("boom")
        await asyncio.sleep(10 * MS if value == 0 else 0)
        return value

    op, rec = operator_factory(fn, ordered=True)

    async def main():
        await feed(op, [0, 1, 2])
        await op.drain()

    asyncio.run(main())
    assert [(k, v) for k, v, _ in rec.log] == [("emit", 0), ("fail", 1), ("emit", 2)]
    assert isinstance(rec.failures[1], ValueError)


def test_timeout_fails_with_async_io_timeout_and_cancels_the_call(operator_factory):
    cancelled: list[int] = []

    async def fn(value):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(value)
            raise

    op, rec = operator_factory(fn, timeout=20 * MS)

    async def main():
        await feed(op, [5])
        await op.drain()

    asyncio.run(main())
    exc = rec.failures[5]
    assert isinstance(exc, AsyncIOTimeout)
    assert isinstance(exc, asyncio.TimeoutError)
    assert exc.element.token == ("p0", 5) and exc.attempts == 1 and exc.timeout == 20 * MS
    assert cancelled == [5]


@pytest.mark.parametrize("handler_kind", ["sync", "async"])
def test_timeout_handler_supplies_result(operator_factory, handler_kind):
    async def slow(value):
        await asyncio.sleep(10)

    def sync_handler(value):
        return [value, "fallback"]

    async def async_handler(value):
        await asyncio.sleep(MS)
        return [value, "fallback"]

    handler = sync_handler if handler_kind == "sync" else async_handler
    op, rec = operator_factory(slow, timeout=10 * MS, on_timeout=handler)

    async def main():
        await feed(op, [1, 2])
        await op.drain()

    asyncio.run(main())
    assert rec.log == [("emit", 1, [1, "fallback"]), ("emit", 2, [2, "fallback"])]


def test_timeout_handler_exception_fails_element(operator_factory):
    async def slow(value):
        await asyncio.sleep(10)

    def handler(value):
        raise LookupError(value)

    op, rec = operator_factory(slow, timeout=5 * MS, on_timeout=handler)

    async def main():
        await feed(op, [1])
        await op.drain()

    asyncio.run(main())
    assert isinstance(rec.failures[1], LookupError)


def test_repeated_complete_first_outcome_wins(operator_factory):
    """A late result racing the deadline is dropped: one output per element."""
    late_results: list[int] = []

    async def stubborn(value):
        # Swallows the operator's cancellation and returns a late result anyway.
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(5 * MS)
            late_results.append(value)
            return "late"

    op, rec = operator_factory(stubborn, timeout=5 * MS, on_timeout=lambda v: "fallback")

    async def main():
        await feed(op, [1])
        await op.drain()
        await asyncio.sleep(20 * MS)  # let the late result arrive

    asyncio.run(main())
    assert late_results == [1]
    assert rec.log == [("emit", 1, ["fallback"])]


# -- retries -------------------------------------------------------------------------


def counting(fn_per_attempt):
    """Wraps ``fn_per_attempt(value, attempt)`` and counts attempts per value."""
    attempts: dict[Any, int] = {}

    async def fn(value):
        attempts[value] = attempts.get(value, 0) + 1
        return fn_per_attempt(value, attempts[value])

    return fn, attempts


@pytest.mark.parametrize(
    "strategy",
    [
        AsyncRetryStrategies.fixed_delay(3, 2 * MS),
        AsyncRetryStrategies.exponential_backoff(3, MS, 4 * MS, 2.0),
    ],
    ids=["fixed", "exponential"],
)
@pytest.mark.parametrize("ordered", [True, False])
def test_retry_on_result(operator_factory, strategy, ordered):
    # Value v returns an empty result until its v-th attempt.
    fn, attempts = counting(lambda v, n: [] if n < v else [v])
    op, rec = operator_factory(fn, ordered=ordered, retry=strategy.if_result(lambda out: not out))

    async def main():
        await feed(op, [1, 2, 3, 4, 6])
        await settle(op)
        await op.drain()

    asyncio.run(main())
    # max_attempts=3 retries: at most 4 invocations; the last outcome stands.
    assert attempts == {1: 1, 2: 2, 3: 3, 4: 4, 6: 4}
    assert rec.outputs == {1: [1], 2: [2], 3: [3], 4: [4], 6: []}
    if ordered:
        assert rec.values == [1, 2, 3, 4, 6]


@pytest.mark.parametrize(
    "strategy",
    [
        AsyncRetryStrategies.fixed_delay(2, 2 * MS),
        AsyncRetryStrategies.exponential_backoff(2, MS, 4 * MS, 3.0),
    ],
    ids=["fixed", "exponential"],
)
def test_retry_on_exception(operator_factory, strategy):
    def attempt(value, n):
        if n <= value:
            raise ConnectionError(f"{value}#{n}")
        return value

    fn, attempts = counting(attempt)
    op, rec = operator_factory(fn, retry=strategy.if_exception(ConnectionError))

    async def main():
        await feed(op, [0, 1, 2, 3])
        await settle(op)
        await op.drain()

    asyncio.run(main())
    assert attempts == {0: 1, 1: 2, 2: 3, 3: 3}
    assert rec.outputs == {0: [0], 1: [1], 2: [2]}
    assert str(rec.failures[3]) == "3#3"  # the last exception when retries ran out


def test_retry_needs_a_matching_predicate(operator_factory):
    def attempt(value, n):
        raise KeyError(value)

    fn, attempts = counting(attempt)
    retry = AsyncRetryStrategies.fixed_delay(5, MS).if_exception(ConnectionError)
    op, rec = operator_factory(fn, retry=retry)

    async def main():
        await feed(op, [1])
        await op.drain()

    asyncio.run(main())
    assert attempts == {1: 1}
    assert isinstance(rec.failures[1], KeyError)


def test_retry_backoff_follows_the_strategy(operator_factory):
    loop_times: list[float] = []

    async def fn(value):
        loop_times.append(asyncio.get_running_loop().time())
        return None

    retry = AsyncRetryStrategies.exponential_backoff(3, 10 * MS, 25 * MS, 2.0).if_result(
        lambda out: True
    )
    op, _ = operator_factory(fn, retry=retry)

    async def main():
        await feed(op, [1])
        await settle(op)
        await op.drain()

    asyncio.run(main())
    gaps = [b - a for a, b in itertools.pairwise(loop_times)]
    assert len(gaps) == 3
    for gap, expected in zip(gaps, [0.010, 0.020, 0.025], strict=True):
        assert gap >= expected - 0.002  # timers never fire early (clock granularity aside)


def test_timeout_covers_all_retry_attempts(operator_factory):
    fn, attempts = counting(lambda v, n: [])
    retry = AsyncRetryStrategies.fixed_delay(1000, 10 * MS).if_result(lambda out: not out)
    op, rec = operator_factory(fn, retry=retry, timeout=60 * MS)

    async def main():
        await feed(op, [1])
        await settle(op)
        await op.drain()

    asyncio.run(main())
    exc = rec.failures[1]
    assert isinstance(exc, AsyncIOTimeout) and exc.attempts == attempts[1]
    assert 2 <= attempts[1] <= 7  # about 6; the deadline, not max_attempts, stopped it


def test_broken_retry_predicate_fails_the_element(operator_factory):
    def predicate(out):
        raise RuntimeError("bad predicate")

    fn, _ = counting(lambda v, n: v)
    op, rec = operator_factory(
        fn, retry=AsyncRetryStrategies.fixed_delay(1, MS).if_result(predicate)
    )

    async def main():
        await feed(op, [1, 2])
        await settle(op)
        await op.drain()

    asyncio.run(main())
    assert set(rec.failures) == {1, 2}


def test_drain_fires_pending_retries_immediately(operator_factory):
    fn, attempts = counting(lambda v, n: [])
    retry = AsyncRetryStrategies.fixed_delay(5, 60.0).if_result(lambda out: not out)
    op, rec = operator_factory(fn, retry=retry, timeout=None)

    async def main():
        await feed(op, [1, 2, 3])
        await asyncio.sleep(MS)  # first attempts done, retries waiting 60 s
        await asyncio.wait_for(op.drain(), timeout=2)

    asyncio.run(main())
    # One retry fired at drain; its outcome is final even though it still matches.
    assert attempts == {1: 2, 2: 2, 3: 2}
    assert rec.outputs == {1: [], 2: [], 3: []}


# -- capacity, backpressure, restart ---------------------------------------------------


@pytest.mark.parametrize("ordered", [True, False])
def test_capacity_is_never_exceeded(operator_factory, ordered):
    concurrent = 0
    peak = 0
    rng = random.Random(7)

    async def fn(value):
        nonlocal concurrent, peak
        concurrent += 1
        peak = max(peak, concurrent)
        await asyncio.sleep(rng.random() * 3 * MS)
        concurrent -= 1
        return value

    op, rec = operator_factory(fn, ordered=ordered, capacity=4)
    observed: list[int] = []

    async def main():
        for i in range(60):
            await op.process(Element(i))
            observed.append(op.in_flight)
        await op.drain()

    asyncio.run(main())
    assert peak <= 4 and max(observed) <= 4
    assert sorted(rec.values) == list(range(60))


def test_process_blocks_while_queue_is_full(operator_factory):
    release = asyncio.Event

    async def main():
        gate = release()

        async def fn(value):
            await gate.wait()
            return value

        op, rec = operator_factory(fn, capacity=2, timeout=None)
        await op.process(Element(0))
        await op.process_watermark(0)  # watermarks take a slot too
        third = asyncio.create_task(op.process(Element(1)))
        await asyncio.sleep(5 * MS)
        assert not third.done() and op.in_flight == 2
        gate.set()
        await asyncio.wait_for(third, timeout=1)
        await op.drain()
        return rec

    rec = asyncio.run(main())
    assert [(k, v) for k, v, _ in rec.log] == [("emit", 0), ("wm", 0), ("emit", 1)]


def test_async_emit_backpressures_and_keeps_order(operator_factory):
    delivered: list[int] = []
    in_flight: list[int] = []

    async def main():
        async def slow_emit(element, outputs):
            await asyncio.sleep(MS)
            delivered.append(element.value)
            in_flight.append(op.in_flight)

        op, _ = operator_factory(
            sleeper({i: (i % 3) * MS for i in range(20)}), capacity=3, emit=slow_emit
        )
        await feed(op, list(range(20)))
        await op.drain()

    asyncio.run(main())
    assert delivered == list(range(20))
    assert max(in_flight) <= 3


def test_restart_with_full_queue_gives_same_outputs(operator_factory):
    inputs = list(range(12))
    delays = {i: ((i * 7) % 5) * MS for i in inputs}

    async def reference() -> Recorder:
        op, rec = operator_factory(sleeper(delays), capacity=4)
        await feed(op, inputs)
        await op.drain()
        return rec

    async def crash_and_restart() -> tuple[list[Element], Recorder]:
        gate = asyncio.Event()

        async def stuck(value):
            await gate.wait()

        first, first_rec = operator_factory(stuck, capacity=4)
        await feed(first, inputs[:4])  # queue is now full
        blocked = asyncio.create_task(first.process(Element(inputs[4])))
        await asyncio.sleep(MS)
        unsettled = first.abort()
        with pytest.raises(OperatorClosedError):
            await blocked
        assert first_rec.log == [] and first.in_flight == 0
        # A new instance re-processes what was not settled, then the rest of the input.
        second, rec = operator_factory(sleeper(delays), capacity=4)
        for element in unsettled:
            await second.process(element)
        await feed(second, inputs[4:])
        await second.drain()
        return unsettled, rec

    expected = asyncio.run(reference())
    unsettled, restarted = asyncio.run(crash_and_restart())
    assert [e.value for e in unsettled] == inputs[:4]
    assert restarted.log == expected.log


def test_pending_lists_unsettled_elements_in_input_order(operator_factory):
    async def main():
        gate = asyncio.Event()

        async def fn(value):
            if value == 0:
                await gate.wait()
            return value

        op, _ = operator_factory(fn, ordered=True, timeout=None)
        await feed(op, [0, 1, 2])
        await asyncio.sleep(MS)
        before = [e.value for e in op.pending()]
        gate.set()
        await op.drain()
        return before, op.pending()

    before, after = asyncio.run(main())
    assert before == [0, 1, 2] and after == []


# -- lifecycle -----------------------------------------------------------------------


def test_process_after_drain_is_rejected(operator_factory):
    op, _ = operator_factory(sleeper({}))

    async def main():
        await op.drain()
        with pytest.raises(OperatorClosedError):
            await op.process(Element(1))

    asyncio.run(main())


def test_drain_timeout_raises_timeout_error(operator_factory):
    async def slow(value):
        await asyncio.sleep(10)

    op, _ = operator_factory(slow, timeout=None)

    async def main():
        await feed(op, [1])
        with pytest.raises(TimeoutError):
            await op.drain(timeout=5 * MS)
        assert [e.value for e in op.abort()] == [1]

    asyncio.run(main())


@pytest.mark.parametrize("callback_kind", ["sync", "async"])
def test_callback_error_stops_the_operator(operator_factory, callback_kind):
    def sync_emit(element, outputs):
        if element.value == 1:
            raise RuntimeError("sink down")

    async def async_emit(element, outputs):
        sync_emit(element, outputs)

    emit = sync_emit if callback_kind == "sync" else async_emit
    op, _ = operator_factory(sleeper({}), emit=emit)

    async def main():
        await feed(op, [0, 1])
        await asyncio.sleep(MS)
        with pytest.raises(CallbackError) as info:
            await op.process(Element(2))
        assert info.value.callback == "emit" and isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(CallbackError):
            await op.drain()

    asyncio.run(main())


def test_sync_function_result_is_accepted(operator_factory):
    op, rec = operator_factory(lambda v: v + 1)

    async def main():
        await feed(op, [1, 2])
        await op.drain()

    asyncio.run(main())
    assert rec.outputs == {1: [2], 2: [3]}


@pytest.mark.parametrize(
    "options",
    [{"capacity": 0}, {"timeout": 0}, {"timeout": -1.0}, {"time_mode": "ingestion"}],
)
def test_invalid_configuration(options):
    with pytest.raises(ConfigurationError):
        AsyncWaitOperator(sleeper({}), emit=print, fail=print, **options)


def test_drain_makes_the_next_outcome_final(operator_factory):
    fn, attempts = counting(lambda v, n: [])
    retry = AsyncRetryStrategies.fixed_delay(5, MS).if_result(lambda out: not out)
    op, rec = operator_factory(fn, retry=retry)

    async def main():
        await feed(op, [1])
        await op.drain()  # before the first attempt completed: it is not retried

    asyncio.run(main())
    assert attempts == {1: 1} and rec.outputs == {1: []}


def test_cancelled_waiter_passes_its_wake_up_on(operator_factory):
    async def main():
        gate = asyncio.Event()

        async def fn(value):
            await gate.wait()
            return value

        op, rec = operator_factory(fn, capacity=1, timeout=None)
        await op.process(Element(0))
        cancelled = asyncio.create_task(op.process(Element(1)))
        waiting = asyncio.create_task(op.process(Element(2)))
        await asyncio.sleep(MS)
        gate.set()
        while op.in_flight:  # element 0 settles and wakes the first waiter...
            await asyncio.sleep(0)
        cancelled.cancel()  # ...which is cancelled before it runs
        await asyncio.wait_for(waiting, timeout=1)
        await op.drain()
        return rec

    rec = asyncio.run(main())
    assert rec.values == [0, 2]
