"""``ctx.timers``: durable event-time and processing-time timers per key.

Registrations and deletions are buffered while the action runs and journaled with its
ActionDone (in its ``timers`` field and as Timer records, before the key's memory
snapshot), so a crashed action registers nothing and a completed one's timers survive
any number of restarts. A timer fires once: the host runs the actions listening for
:class:`~agents_stream.events.TimerEvent` for that key, then the timer is removed.

One timer exists per (key, kind, timestamp, agent): registering it again is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable

from .journal import TIMER_KINDS, TimerUpdate


class Timers:
    """Register or delete timers of the current key (epoch milliseconds).

    Not usable inside a code block (raises ``CodeBlockViolation``), like memory.
    Within a timer's own firing, registering or deleting that same timer is ignored: it
    is already firing and is removed when the firing completes.
    """

    def __init__(self, guard: Callable[[str], None], firing: tuple[str, int] | None = None) -> None:
        self._guard = guard
        self._firing = firing
        self._updates: dict[tuple[str, int], bool] = {}  # (kind, ts) -> deleted

    def register_event_time(self, ts: int) -> None:
        """Fire a ``TimerEvent(kind="event")`` once the watermark reaches ``ts``."""
        self._set("event", ts, deleted=False, what="register_event_time")

    def register_processing_time(self, ts: int) -> None:
        """Fire a ``TimerEvent(kind="processing")`` once wall-clock time reaches ``ts``."""
        self._set("processing", ts, deleted=False, what="register_processing_time")

    def delete_event_time(self, ts: int) -> None:
        """Cancel an event-time timer (no-op when none is registered at ``ts``)."""
        self._set("event", ts, deleted=True, what="delete_event_time")

    def delete_processing_time(self, ts: int) -> None:
        """Cancel a processing-time timer (no-op when none is registered at ``ts``)."""
        self._set("processing", ts, deleted=True, what="delete_processing_time")

    def _set(self, kind: str, ts: int, *, deleted: bool, what: str) -> None:
        self._guard(f"timers.{what}")
        assert kind in TIMER_KINDS
        if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
            raise ValueError(f"timer timestamp must be a non-negative int (epoch ms), got {ts!r}")
        if (kind, ts) == self._firing:
            return
        self._updates[(kind, ts)] = deleted

    @property
    def updates(self) -> tuple[TimerUpdate, ...]:
        """Buffered changes, in first-touch order."""
        if not self._updates:  # read after every action run, mostly empty
            return ()
        return tuple(TimerUpdate(k, ts, d) for (k, ts), d in self._updates.items())
