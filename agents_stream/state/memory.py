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

Identity = tuple[object, ...]


class InMemoryActionStateStore(ActionStateStore):
    def __init__(self, entries: Sequence[JournalEntry] = ()) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Identity, JournalEntry] = {}
        # Entries of one input record (or timer firing) by (key, seq): a backfill task runs
        # thousands of records against one snapshot, so lookups must not scan it all.
        self._by_record: dict[tuple[object, object], set[Identity]] = {}
        self.log: list[JournalEntry | tuple[str, Identity]] = []
        for entry in entries:
            self._put(entry_key(entry), entry)

    def _put(self, identity: Identity, entry: JournalEntry) -> None:
        self._entries[identity] = entry
        if identity[0] in ("c", "a", "t"):
            self._by_record.setdefault((identity[1], identity[2]), set()).add(identity)

    def _delete(self, identity: Identity) -> bool:
        found = self._entries.pop(identity, None) is not None
        if found and identity[0] in ("c", "a", "t"):
            group = self._by_record.get((identity[1], identity[2]))
            if group is not None:
                group.discard(identity)
                if not group:
                    del self._by_record[(identity[1], identity[2])]
        return found

    def _record(self, key: str, seq: int) -> list[Identity]:
        return list(self._by_record.get((key, seq), ()))

    def calls(self, ref: ActionRef) -> dict[int, CallEntry]:
        with self._lock:
            out = {}
            for k in self._record(ref.key, ref.seq):
                e = self._entries[k]
                if isinstance(e, CallEntry) and k[:4] == ("c", ref.key, ref.seq, ref.action):
                    out[e.index] = e
            return out

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
                    if self._delete(entry.identity):
                        self.log.append(("delete", entry.identity))
                    continue
                self._put(entry_key(entry), entry)
                self.log.append(entry)
        return completed_future()

    def forget_firing(self, timer: TimerEntry) -> Future[None]:
        with self._lock:
            for k in self._record(timer.key, timer.seq):
                if timer.owns(str(k[3])):
                    self._delete(k)
                    self.log.append(("delete", k))
        return completed_future()

    def remove_calls(self, ref: ActionRef, from_index: int) -> Future[None]:
        with self._lock:
            for k in self._record(ref.key, ref.seq):
                if k[:4] == ("c", ref.key, ref.seq, ref.action) and int(k[4]) >= from_index:  # type: ignore[call-overload]
                    self._delete(k)
                    self.log.append(("delete", k))
        return completed_future()

    def prune(self, key: str, seq: int, partition: int) -> None:
        with self._lock:
            for k in self._record(key, seq):
                self._delete(k)

    def entries(self) -> list[JournalEntry]:
        with self._lock:
            return list(self._entries.values())
