"""Event-time watermarks over the partitions of one input topic.

Flink's ``WatermarkStrategy.forBoundedOutOfOrderness(d).withIdleness(t)`` applied per
Kafka partition and combined as Flink's source does (``WatermarkOutputMultiplexer``):

* each partition's watermark is ``max timestamp seen - out_of_orderness - 1``: after it,
  records of that partition at or below the watermark are *late*;
* the combined watermark is the minimum over the **active** partitions; a partition that
  had no record for ``idle_timeout_ms`` of processing time is idle and left out, so one
  quiet partition does not hold event time back for all the others; it rejoins the
  minimum with its next record;
* the combined watermark never goes back: a value is returned only when it advances, and
  nothing is returned while every partition is idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


def monotonic_ms() -> int:
    """Processing time for idleness: a monotonic clock in milliseconds."""
    return time.monotonic_ns() // 1_000_000


@dataclass
class _PartitionState:
    max_timestamp: int
    last_active_ms: int


class WatermarkGenerator:
    """Bounded-out-of-orderness watermarks with idle-partition exclusion.

    Not thread-safe; one generator belongs to one host on one event loop.

    Args:
        out_of_orderness_ms: How far behind the newest timestamp of a partition a
            record may still arrive without being late.
        idle_timeout_ms: Processing time without records after which a partition is
            idle; None never marks partitions idle (a silent partition then stops the
            watermark, as in Flink without ``withIdleness``).
        clock: Processing-time clock in ms used by ``on_record`` (tests inject one).
    """

    def __init__(
        self,
        out_of_orderness_ms: int,
        idle_timeout_ms: int | None = None,
        *,
        clock: Callable[[], int] = monotonic_ms,
    ) -> None:
        if out_of_orderness_ms < 0:
            raise ValueError(f"out_of_orderness_ms must be >= 0, got {out_of_orderness_ms}")
        if idle_timeout_ms is not None and idle_timeout_ms <= 0:
            raise ValueError(f"idle_timeout_ms must be > 0 or None, got {idle_timeout_ms}")
        self.out_of_orderness_ms = out_of_orderness_ms
        self.idle_timeout_ms = idle_timeout_ms
        self._clock = clock
        self._partitions: dict[Hashable, _PartitionState] = {}
        self._current: int | None = None

    @property
    def current(self) -> int | None:
        """The last watermark returned (None before the first one)."""
        return self._current

    def on_record(
        self, partition: Hashable, timestamp: int, now_ms: int | None = None
    ) -> int | None:
        """Accounts for a record; returns the combined watermark if it advanced.

        A record older than its partition's maximum (out of order, or late) changes no
        watermark but still marks the partition active.
        """
        now = self._clock() if now_ms is None else now_ms
        state = self._partitions.get(partition)
        if state is None:
            self._partitions[partition] = _PartitionState(timestamp, now)
        else:
            state.max_timestamp = max(state.max_timestamp, timestamp)
            state.last_active_ms = now
        return self._advance(now)

    def on_idle_check(self, now_ms: int | None = None) -> int | None:
        """Re-evaluates idleness at ``now_ms``; returns the watermark if it advanced.

        Call it periodically (Flink's auto-watermark interval): the watermark can only
        advance without new records when a lagging partition turns idle.
        """
        return self._advance(self._clock() if now_ms is None else now_ms)

    def forget(self, partition: Hashable) -> None:
        """Drops a partition (revoked): it no longer holds the watermark back."""
        self._partitions.pop(partition, None)

    def is_idle(self, partition: Hashable, now_ms: int) -> bool:
        """True if ``partition`` is unknown or had no record for ``idle_timeout_ms``."""
        state = self._partitions.get(partition)
        if state is None:
            return True
        return self.idle_timeout_ms is not None and (
            now_ms - state.last_active_ms >= self.idle_timeout_ms
        )

    def _advance(self, now_ms: int) -> int | None:
        active = [
            state.max_timestamp - self.out_of_orderness_ms - 1
            for partition, state in self._partitions.items()
            if not self.is_idle(partition, now_ms)
        ]
        if not active:
            return None  # all idle: event time stands still rather than jumping ahead
        candidate = min(active)
        if self._current is not None and candidate <= self._current:
            return None
        self._current = candidate
        return candidate
