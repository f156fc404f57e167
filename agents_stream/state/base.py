"""The ActionStateStore interface the durable core runs against.

Reads are served from a local view (dict or RocksDB) of the journal; writes are appended
to the durable log and acknowledged through a ``concurrent.futures.Future`` so that a
code block can wait for *its* record's ack without flushing anybody else's.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future

from ..durable.journal import ActionDone, ActionRef, CallEntry, JournalEntry, MemorySnapshot


def completed_future() -> Future[None]:
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


def all_of(futures: Sequence[Future[None]]) -> Future[None]:
    """A future that resolves when every one of ``futures`` has (first error wins)."""
    if not futures:
        return completed_future()
    if len(futures) == 1:
        return futures[0]
    combined: Future[None] = Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(fut: Future[None]) -> None:
        exc = fut.exception()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if combined.done():
            return
        if exc is not None:
            combined.set_exception(exc)
        elif last:
            combined.set_result(None)

    for fut in futures:
        fut.add_done_callback(one_done)
    return combined


class ActionStateStore(ABC):
    """Durable journal of ActionStates plus a read view of it."""

    @abstractmethod
    def calls(self, ref: ActionRef) -> dict[int, CallEntry]:
        """Journaled call slots of one action run, by call index."""

    @abstractmethod
    def done(self, ref: ActionRef) -> ActionDone | None:
        """The completion record of an action run, if it completed."""

    @abstractmethod
    def memory(self, key: str, partition: int) -> MemorySnapshot | None:
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
