"""The ActionStateStore interface the durable core runs against.

Reads are served from a local view (dict or RocksDB) of the journal; writes are appended
to the durable log and acknowledged through a ``concurrent.futures.Future`` so that a
code block can wait for *its* record's ack without flushing anybody else's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future

from ..durable.journal import ActionDone, ActionRef, CallEntry, JournalEntry, MemorySnapshot


def completed_future() -> Future[None]:
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


class ActionStateStore(ABC):
    """Durable journal of ActionStates plus a read view of it."""

    @abstractmethod
    def calls(self, ref: ActionRef) -> dict[int, CallEntry]:
        """Journaled call slots of one action run, by call index."""

    @abstractmethod
    def done(self, ref: ActionRef) -> ActionDone | None:
        """The completion record of an action run, if it completed."""

    @abstractmethod
    def memory(self, key: str) -> MemorySnapshot | None:
        """Latest short-term memory snapshot of ``key``."""

    @abstractmethod
    def append(self, entries: Sequence[JournalEntry], partition: int) -> Future[None]:
        """Append entries in order; the future resolves once all are durable."""

    @abstractmethod
    def remove_calls(self, ref: ActionRef, from_index: int) -> Future[None]:
        """Tombstone call slots ``from_index`` and later (truncation after divergence)."""

    @abstractmethod
    def prune(self, key: str, seq: int, partition: int) -> None:
        """Tombstone every entry of an input record whose offset is committed."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release local resources."""
