"""Which input offset may be committed: the lowest one not yet finished.

Records finish out of order (different keys run concurrently), so the committable
position of a partition is the smallest offset still in flight, or one past the highest
offset seen when nothing is. Committing never passes an unfinished record.
"""

from __future__ import annotations

import heapq


class PartitionOffsets:
    def __init__(self) -> None:
        self._heap: list[int] = []
        self._open: set[int] = set()
        # One past the highest offset started (-1 before the first). An attribute, not a
        # property: read for every record dispatched.
        self.next = -1
        self.committed = -1

    def start(self, offset: int) -> None:
        self._open.add(offset)
        heapq.heappush(self._heap, offset)
        if offset >= self.next:
            self.next = offset + 1

    def finish(self, offset: int) -> None:
        is_open = self._open
        is_open.discard(offset)
        heap = self._heap
        while heap and heap[0] not in is_open:
            heapq.heappop(heap)

    @property
    def oldest(self) -> int:
        """The lowest offset started and not finished, else one past the highest."""
        return self._heap[0] if self._heap else self.next

    @property
    def in_flight(self) -> int:
        return len(self._open)

    def committable(self) -> int | None:
        """Offset to commit (next to consume), or None when nothing new is finished."""
        position = self._heap[0] if self._heap else self.next
        if position < 0 or position <= self.committed:
            return None
        return position
