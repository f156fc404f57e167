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
from typing import TYPE_CHECKING

from ..events import TimerEvent

if TYPE_CHECKING:
    from ..app import App


def monotonic_ms() -> int:
    """Processing time for idleness: a monotonic clock in milliseconds."""
    return time.monotonic_ns() // 1_000_000


def agent_watermarks(app: App) -> dict[str, WatermarkGenerator]:
    """Event time per agent input topic, only where something waits for it: an agent
    with an action for ``TimerEvent`` (its event-time timers fire at watermarks), or every
    agent in strict epoch mode (records wait for watermarks). Elsewhere a record pays
    nothing for event time."""
    return {
        b.input: WatermarkGenerator(app.out_of_orderness_ms, app.idle_timeout_ms)
        for b in app.agents
        if app.epoch_mode == "strict"
        or any(issubclass(TimerEvent, a.listens) for a in b.agent.actions())
    }


_NEVER = float("-inf")
_FOREVER = float("inf")


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
        # on_record runs for every input record, so the minimum over the active
        # partitions is kept incrementally instead of rescanned. Invariant: ``_active``
        # maps exactly the partitions active at ``_eval_now`` to their max timestamp,
        # ``_min`` is its smallest value (None when empty), and no active partition
        # turns idle before ``_next_idle_at`` (a lower bound: an early rescan is only
        # wasted work). Idle partitions stay idle as time moves forward, so until
        # ``_next_idle_at`` the active set changes only by records and ``forget``.
        self._active: dict[Hashable, int] = {}
        self._min: int | None = None
        self._eval_now = _NEVER
        self._next_idle_at = _FOREVER

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
        timeout = self.idle_timeout_ms
        if now_ms is not None:
            now = now_ms
        elif timeout is not None:
            now = self._clock()
        else:
            now = 0  # never idle: processing time is not needed
        state = self._partitions.get(partition)
        if state is None:
            high = timestamp
            self._partitions[partition] = _PartitionState(timestamp, now)
        else:
            high = state.max_timestamp
            if timestamp > high:
                high = state.max_timestamp = timestamp
            state.last_active_ms = now
        if timeout is not None:
            if now < self._eval_now or now >= self._next_idle_at:
                # The clock went back (idle partitions may be active again) or an
                # active one may have gone idle: rescan.
                return self._advance(now)
            self._eval_now = now
            deadline = now + timeout
            if deadline < self._next_idle_at:
                self._next_idle_at = deadline
        active = self._active
        previous = active.get(partition)
        lowest = self._min
        if previous is None:  # new, or idle until this record: it rejoins the minimum
            active[partition] = high
            if lowest is None or high < lowest:
                lowest = self._min = high
        elif high != previous:
            active[partition] = high
            if previous == lowest:  # it may have held the minimum alone
                lowest = self._min = min(active.values())
        assert lowest is not None
        candidate = lowest - self.out_of_orderness_ms - 1
        current = self._current
        if current is not None and candidate <= current:
            return None
        self._current = candidate
        return candidate

    def on_idle_check(self, now_ms: int | None = None) -> int | None:
        """Re-evaluates idleness at ``now_ms``; returns the watermark if it advanced.

        Call it periodically (Flink's auto-watermark interval): the watermark can only
        advance without new records when a lagging partition turns idle.
        """
        return self._advance(self._clock() if now_ms is None else now_ms)

    def forget(self, partition: Hashable) -> None:
        """Drops a partition (revoked): it no longer holds the watermark back."""
        self._partitions.pop(partition, None)
        previous = self._active.pop(partition, None)
        if previous is not None and previous == self._min:
            self._min = min(self._active.values(), default=None)

    def is_idle(self, partition: Hashable, now_ms: int) -> bool:
        """True if ``partition`` is unknown or had no record for ``idle_timeout_ms``."""
        state = self._partitions.get(partition)
        if state is None:
            return True
        return self.idle_timeout_ms is not None and (
            now_ms - state.last_active_ms >= self.idle_timeout_ms
        )

    def _advance(self, now_ms: int) -> int | None:
        """Rebuilds the active set at ``now_ms`` and returns the watermark if it advanced."""
        timeout = self.idle_timeout_ms
        if timeout is None:
            active = {p: s.max_timestamp for p, s in self._partitions.items()}
            next_idle_at = _FOREVER
        else:
            active = {}
            next_idle_at = _FOREVER
            for partition, state in self._partitions.items():
                deadline = state.last_active_ms + timeout
                if now_ms < deadline:  # not idle: now - last_active < timeout
                    active[partition] = state.max_timestamp
                    if deadline < next_idle_at:
                        next_idle_at = deadline
        self._active = active
        self._eval_now = now_ms
        self._next_idle_at = next_idle_at
        lowest = self._min = min(active.values(), default=None)
        if lowest is None:
            return None  # all idle: event time stands still rather than jumping ahead
        candidate = lowest - self.out_of_orderness_ms - 1
        if self._current is not None and candidate <= self._current:
            return None
        self._current = candidate
        return candidate
