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
    InputProgress,
    JournalEntry,
    MemorySnapshot,
    TimerEntry,
    Tombstone,
    TwoPhaseCall,
    entry_key,
    progress_identity,
    ref_identity,
)
from ..durable.ownership import Ownership
from ..durable.store import ActionStateStore, completed_future

Identity = tuple[object, ...]


class InMemoryActionStateStore(ActionStateStore):
    # As the Kafka store's (state/kafka.py): with holds to check, no write for a partition
    # not held (the test kit simulates a crash by releasing one).
    ownership: Ownership | None = None

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
            head = ref_identity("c", ref)
            for k in self._record(ref.key, ref.seq):
                e = self._entries[k]
                if isinstance(e, CallEntry) and k[:-1] == head:
                    out[e.index] = e
            return out

    def done(self, ref: ActionRef) -> ActionDone | None:
        entry = self._entries.get(ref_identity("a", ref))
        return entry if isinstance(entry, ActionDone) else None

    def progress(self, topic: str, partition: int) -> InputProgress | None:
        entry = self._entries.get(progress_identity(topic, partition))
        return entry if isinstance(entry, InputProgress) else None

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
        if self.ownership is not None:
            self.ownership.check_partition(partition, "journal write")
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
                if timer.owns(str(k[-1] if k[0] == "a" else k[-2])):
                    self._delete(k)
                    self.log.append(("delete", k))
        return completed_future()

    def remove_calls(self, ref: ActionRef, from_index: int) -> Future[None]:
        with self._lock:
            head = ref_identity("c", ref)
            for k in self._record(ref.key, ref.seq):
                if k[:-1] == head and int(k[-1]) >= from_index:  # type: ignore[call-overload]
                    self._delete(k)
                    self.log.append(("delete", k))
        return completed_future()

    @property
    def partitions(self) -> list[int]:
        with self._lock:
            return sorted({e.ref.partition for e in self._entries.values() if hasattr(e, "ref")})

    def obligation(self, ref: ActionRef, index: int) -> TwoPhaseCall | None:
        entry = self._entries.get(ref_identity("x", ref, index))
        return entry if isinstance(entry, TwoPhaseCall) else None

    def obligations(self, partition: int) -> list[TwoPhaseCall]:
        with self._lock:
            return [
                e
                for e in self._entries.values()
                if isinstance(e, TwoPhaseCall) and e.ref.partition == partition
            ]

    def prune_settled(self, records: Sequence[tuple[int, str]], partition: int, topic: str) -> None:
        for seq, key in records:
            self._prune(key, seq, topic)
            with self._lock:
                for identity, e in list(self._entries.items()):
                    if isinstance(e, TwoPhaseCall) and (e.ref.key, e.ref.seq, e.ref.topic) == (
                        key,
                        seq,
                        topic,
                    ):
                        self._delete(identity)
                        self.log.append(("delete", identity))

    def prune(self, key: str, seq: int, partition: int, topic: str = "") -> None:
        # A record with a two-phase obligation keeps its journal until it is settled.
        if any(
            isinstance(e, TwoPhaseCall) and (e.ref.key, e.ref.seq, e.ref.topic) == (key, seq, topic)
            for e in self.obligations(partition)
        ):
            self._held_back.add((topic, partition, seq, key))
            return
        self._prune(key, seq, topic)

    def _prune(self, key: str, seq: int, topic: str) -> None:
        legacy_too = not topic or topic in self.legacy_topics
        with self._lock:
            for k in self._record(key, seq):
                entry = self._entries[k]
                entry_topic = getattr(entry, "ref", None) and entry.ref.topic  # type: ignore[union-attr]
                if entry_topic == topic or (legacy_too and not entry_topic):
                    self._delete(k)

    def entries(self) -> list[JournalEntry]:
        with self._lock:
            return list(self._entries.values())
