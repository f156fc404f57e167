"""WatermarkGenerator keeps its minimum incrementally: it must return exactly what the
straightforward rescan-every-record algorithm (kept here as the model) returns."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.runtime.watermarks import WatermarkGenerator


class _ModelGenerator:
    """The generator as it was before the incremental minimum: every call rescans every
    partition's idleness."""

    def __init__(
        self, out_of_orderness_ms: int, idle_timeout_ms: int | None, clock: Callable[[], int]
    ) -> None:
        self.out_of_orderness_ms = out_of_orderness_ms
        self.idle_timeout_ms = idle_timeout_ms
        self._clock = clock
        self._partitions: dict[Hashable, list[int]] = {}  # [max_timestamp, last_active_ms]
        self.current: int | None = None

    def on_record(self, partition: Hashable, timestamp: int, now_ms: int | None) -> int | None:
        now = self._clock() if now_ms is None else now_ms
        state = self._partitions.get(partition)
        if state is None:
            self._partitions[partition] = [timestamp, now]
        else:
            state[0] = max(state[0], timestamp)
            state[1] = now
        return self._advance(now)

    def on_idle_check(self, now_ms: int | None) -> int | None:
        return self._advance(self._clock() if now_ms is None else now_ms)

    def forget(self, partition: Hashable) -> None:
        self._partitions.pop(partition, None)

    def is_idle(self, partition: Hashable, now_ms: int) -> bool:
        state = self._partitions.get(partition)
        if state is None:
            return True
        return self.idle_timeout_ms is not None and now_ms - state[1] >= self.idle_timeout_ms

    def _advance(self, now_ms: int) -> int | None:
        active = [
            state[0] - self.out_of_orderness_ms - 1
            for partition, state in self._partitions.items()
            if not self.is_idle(partition, now_ms)
        ]
        if not active:
            return None
        candidate = min(active)
        if self.current is not None and candidate <= self.current:
            return None
        self.current = candidate
        return candidate


_partitions = st.integers(0, 4)
_times = st.integers(0, 3_000)
# Mostly forward clock steps, as in production, with occasional jumps back.
_clock_step = st.one_of(st.integers(0, 400), st.integers(-1_500, 0))
_now = st.one_of(st.none(), _times)

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), _partitions, _times, _clock_step, _now),
        st.tuples(st.just("record"), _partitions, _times, _clock_step, st.none()),
        st.tuples(st.just("idle"), _clock_step, _now),
        st.tuples(st.just("forget"), _partitions),
        st.tuples(st.just("is_idle"), _partitions, _times),
    ),
    max_size=80,
)


@settings(max_examples=600, deadline=None)
@given(
    ooo=st.integers(0, 300),
    idle_timeout=st.one_of(st.none(), st.integers(1, 1_500)),
    start=_times,
    ops=_ops,
)
def test_incremental_generator_matches_rescanning_model(ooo, idle_timeout, start, ops):
    clock = [start]
    gen = WatermarkGenerator(ooo, idle_timeout, clock=lambda: clock[0])
    model = _ModelGenerator(ooo, idle_timeout, lambda: clock[0])
    for op in ops:
        if op[0] == "record":
            _, partition, ts, step, now = op
            clock[0] += step
            assert gen.on_record(partition, ts, now) == model.on_record(partition, ts, now), op
        elif op[0] == "idle":
            _, step, now = op
            clock[0] += step
            assert gen.on_idle_check(now) == model.on_idle_check(now), op
        elif op[0] == "forget":
            gen.forget(op[1])
            model.forget(op[1])
        else:
            _, partition, at = op
            assert gen.is_idle(partition, at) == model.is_idle(partition, at), op
        assert gen.current == model.current
