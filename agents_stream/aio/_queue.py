"""Queues holding in-flight entries until they may be emitted (Flink's StreamElementQueue).

Entries enter in input order and leave through ``pop_completed`` in the order the
operator's mode allows. Capacity is not enforced here: the operator counts a slot as
busy until the popped entry has been delivered, which a queue cannot see.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .operator import Element


class RecordEntry:
    """An element's slot; completed exactly once, later completions are ignored."""

    __slots__ = ("done", "element", "error", "results", "segment")

    def __init__(self, element: Element) -> None:
        self.element = element
        self.done = False
        self.results: list[Any] = []
        self.error: BaseException | None = None
        self.segment: _Segment | None = None

    def complete(self, results: list[Any] | None, error: BaseException | None) -> bool:
        """Records the outcome; returns False (and changes nothing) if already complete.

        A timeout racing a late result, or a retry timer firing after cancellation, can
        both try to complete an entry: the first one wins, as in Flink.
        """
        if self.done:
            return False
        self.done = True
        self.results = results if results is not None else []
        self.error = error
        return True


class WatermarkEntry:
    """A watermark waiting for its turn; complete from the start."""

    __slots__ = ("timestamp",)
    done = True

    def __init__(self, timestamp: int) -> None:
        self.timestamp = timestamp


Entry = RecordEntry | WatermarkEntry


class ElementQueue(Protocol):
    """What the operator needs from a queue."""

    def put(self, entry: Entry) -> None:
        """Appends an entry in input order."""

    def on_completed(self, entry: RecordEntry) -> None:
        """Called once after ``entry.complete`` succeeded."""

    def pop_completed(self) -> Entry | None:
        """Removes and returns the next entry that may be emitted, or None."""

    def clear(self) -> None:
        """Forgets every entry (abort)."""


class OrderedQueue:
    """Emits strictly in input order: a completed entry waits for all earlier ones."""

    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()

    def put(self, entry: Entry) -> None:
        self._entries.append(entry)

    def on_completed(self, entry: RecordEntry) -> None:
        pass

    def pop_completed(self) -> Entry | None:
        if self._entries and self._entries[0].done:
            return self._entries.popleft()
        return None

    def clear(self) -> None:
        self._entries.clear()


class _Segment:
    """Records between two watermarks (or one watermark alone, if ``barrier``)."""

    __slots__ = ("barrier", "completed", "incomplete")

    def __init__(self, *, barrier: bool) -> None:
        self.barrier = barrier
        self.incomplete: set[RecordEntry] = set()
        self.completed: deque[Entry] = deque()


class UnorderedQueue:
    """Emits entries as they complete, within watermark segments if ``watermark_barriers``.

    With barriers (event time) each watermark closes a segment: entries of a segment are
    emitted in completion order, but only once every earlier segment, and the watermark
    separating them, has been emitted. Without barriers (processing time) there is one
    segment and a watermark is emitted as soon as it is its turn in completion order.
    """

    def __init__(self, *, watermark_barriers: bool) -> None:
        self._barriers = watermark_barriers
        self._segments: deque[_Segment] = deque()

    def _open_segment(self) -> _Segment:
        if self._segments and not self._segments[-1].barrier:
            return self._segments[-1]
        segment = _Segment(barrier=False)
        self._segments.append(segment)
        return segment

    def put(self, entry: Entry) -> None:
        if isinstance(entry, WatermarkEntry):
            if self._barriers:
                segment = _Segment(barrier=True)
                self._segments.append(segment)
            else:
                segment = self._open_segment()
            segment.completed.append(entry)
            return
        segment = self._open_segment()
        if entry.done:
            segment.completed.append(entry)
        else:
            entry.segment = segment
            segment.incomplete.add(entry)

    def on_completed(self, entry: RecordEntry) -> None:
        segment = entry.segment
        if segment is None:
            return
        entry.segment = None
        segment.incomplete.discard(entry)
        segment.completed.append(entry)

    def pop_completed(self) -> Entry | None:
        while self._segments:
            head = self._segments[0]
            if head.completed:
                return head.completed.popleft()
            if head.incomplete:
                return None
            # An exhausted segment: a later segment may start only now.
            if len(self._segments) == 1:
                return None
            self._segments.popleft()
        return None

    def clear(self) -> None:
        self._segments.clear()
