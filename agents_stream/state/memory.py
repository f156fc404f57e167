"""In-process ActionStateStore: for unit tests and for hosts that snapshot the journal
(Spark backfill). Nothing survives the process."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

from ..durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    JournalEntry,
    MemorySnapshot,
    TimerEntry,
    Tombstone,
    entry_key,
)
from .base import ActionStateStore, completed_future


class InMemoryActionStateStore(ActionStateStore):
    def __init__(self, entries: Sequence[JournalEntry] = ()) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[object, ...], JournalEntry] = {}
        self.log: list[JournalEntry | tuple[str, tuple[object, ...]]] = []
        for entry in entries:
            self._entries[entry_key(entry)] = entry

    def calls(self, ref: ActionRef) -> dict[int, CallEntry]:
        with self._lock:
            return {
                e.index: e
                for k, e in self._entries.items()
                if isinstance(e, CallEntry) and k[:4] == ("c", ref.key, ref.seq, ref.action)
            }

    def done(self, ref: ActionRef) -> ActionDone | None:
        entry = self._entries.get(("a", ref.key, ref.seq, ref.action))
        return entry if isinstance(entry, ActionDone) else None

    def memory(self, key: str, partition: int = 0) -> MemorySnapshot | None:
        entry = self._entries.get(("m", key))
        return entry if isinstance(entry, MemorySnapshot) else None

    def timer(self, probe: TimerEntry) -> TimerEntry | None:
        entry = self._entries.get(entry_key(probe))
        return entry if isinstance(entry, TimerEntry) else None

    def timers(self, partition: int) -> list[TimerEntry]:
        with self._lock:
            return [
                e
                for e in self._entries.values()
                if isinstance(e, TimerEntry) and e.partition == partition
            ]

    def append(self, entries: Sequence[JournalEntry | Tombstone], partition: int) -> Future[None]:
        with self._lock:
            for entry in entries:
                if isinstance(entry, Tombstone):
                    if self._entries.pop(entry.identity, None) is not None:
                        self.log.append(("delete", entry.identity))
                    continue
                self._entries[entry_key(entry)] = entry
                self.log.append(entry)
        return completed_future()

    def forget_firing(self, timer: TimerEntry) -> Future[None]:
        with self._lock:
            for k in [
                k
                for k, e in self._entries.items()
                if k[0] in ("c", "a", "t")
                and k[1:3] == (timer.key, timer.seq)
                and timer.owns(str(k[3]))
            ]:
                del self._entries[k]
                self.log.append(("delete", k))
        return completed_future()

    def remove_calls(self, ref: ActionRef, from_index: int) -> Future[None]:
        with self._lock:
            for k in [
                k
                for k in self._entries
                if k[:4] == ("c", ref.key, ref.seq, ref.action) and int(k[4]) >= from_index  # type: ignore[call-overload]
            ]:
                del self._entries[k]
                self.log.append(("delete", k))
        return completed_future()

    def prune(self, key: str, seq: int, partition: int) -> None:
        with self._lock:
            for k in [k for k in self._entries if k[0] != "m" and k[1:3] == (key, seq)]:
                del self._entries[k]

    def entries(self) -> list[JournalEntry]:
        with self._lock:
            return list(self._entries.values())
