"""KafkaActionStateStore: the journal in a compacted topic, read through RocksDB.

Writes go to ``<app>-action-state`` partition *p* for input partition *p* (co-partitioned,
so whoever owns the input partition owns its journal). A record's future resolves only
after the broker acked it **and** the acked record is in the local cache, applied one
RocksDB write batch per producer poll. Each partition cache keeps the next topic offset
it reflects (``checkpoint``) so that, on assignment, only the tail written since (by this
worker before a crash, by another owner, or by a Spark reconcile job) is replayed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

from ..durable import keys
from ..durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CompletionGroup,
    InputProgress,
    JournalEntry,
    MemorySnapshot,
    TimerEntry,
    Tombstone,
    Truncation,
    TwoPhaseCall,
)
from ..durable.ownership import Ownership
from ..durable.store import ActionStateStore, all_of
from ..kafka.producer import Ack, AckingProducer
from ..kafka.transactions import TransactionalProducer
from ..serde.journal import JournalCodec
from .cache import FLUSH_EVERY_S, PartitionCache
from .recovery import rebuild_partitions

log = logging.getLogger("agents_stream.state")

# What a code block journals (results, PENDING, truncations): never transactional.
_CALL_JOURNAL = (CallEntry, Truncation, TwoPhaseCall)


class KafkaActionStateStore(ActionStateStore):
    def __init__(
        self,
        *,
        topic: str,
        producer: AckingProducer,
        codec: JournalCodec,
        data_dir: Path,
        bootstrap: str,
        cancel: threading.Event | None = None,
        index_slots: bool = True,
    ) -> None:
        """``cancel``: the host's stop signal; a cache rebuild in :meth:`assign` ends
        early once it is set (raising RebuildCancelled), so a stop is not held up by it.
        ``index_slots``: keep each partition's live per-record keys (calls, ActionDones,
        truncations) in memory (see :class:`PartitionCache`); worth it where records are
        pruned."""
        self.topic = topic
        self._cancel = cancel
        self._producer = producer
        self._codec = codec
        self._dir = data_dir
        self._bootstrap = bootstrap
        self._index_slots = index_slots
        # Called with the partitions an assign() takes, before their caches catch up.
        self.on_assign: list[Callable[[list[int]], None]] = []
        self._caches: dict[int, PartitionCache] = {}
        # Partitions being assigned: the acks that arrive meanwhile, applied once the
        # rebuild is done (see assign).
        self._assigning: dict[int, list[tuple[list[tuple[bytes, bytes | None]], int]]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._flusher: threading.Thread | None = None
        # Set by a host that owns partitions (the worker): no journal record is produced
        # for a partition it does not hold (durable/ownership.py).
        self.ownership: Ownership | None = None
        producer.on_acked(topic, self._on_acked)
        # Exactly-once (see use_transactions): what a finished record writes goes into
        # the open transaction; the partitions whose caches hold some of it.
        self._txn: TransactionalProducer | None = None
        self._uncommitted: set[int] = set()
        # Completion groups appended, not yet acked: their members' done keys, so that
        # applying the ack does not decode what was just encoded.
        self._pending_groups: dict[bytes, list[bytes]] = {}
        self._groups_written = codec.writes_groups

    def use_transactions(self, producer: TransactionalProducer) -> None:
        """Exactly-once: ActionDones, memory snapshots, timers and completed-through
        markers are sent by ``producer``, in its open transaction; journaled calls and
        truncations stay on the idempotent producer, acknowledged before the action goes
        on (guarantee 1 cannot wait for a commit). A cache that receives a transactional
        record is marked uncommitted until :meth:`committed` (see
        ``state/cache.py``), and rebuilds wait for open transactions to end."""
        self._txn = producer
        producer.on_acked(self.topic, self._on_acked)

    @property
    def transactional(self) -> bool:
        return self._txn is not None

    def committed(self, keep: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """The open transaction committed: every cache but those of ``keep`` (partitions
        with sends queued for the next one) holds committed records only."""
        with self._lock:
            for partition in self._uncommitted - keep:
                cache = self._caches.get(partition)
                if cache is not None:
                    cache.mark_committed()
            self._uncommitted &= keep

    # -- partition lifecycle ----------------------------------------------------------
    def assign(self, *partitions: int) -> int:
        """Open (and catch up) the caches of ``partitions``; returns records replayed.

        On failure or cancellation (RebuildCancelled) none of them is assigned and their
        caches are closed: RocksDB locks its directory, and the next owner in this
        process (or the next process) must be able to reopen it."""
        with self._lock:
            wanted = [p for p in partitions if p not in self._caches]
            # An append of this partition still in flight from an earlier ownership (an
            # abandoned record) may be acked after the rebuild read the topic's end and
            # before the cache is in place: kept and applied then, or the checkpoint
            # would move past a record the cache never got (a replay would run that
            # acked call again).
            for p in wanted:
                self._assigning[p] = []
        if not wanted:
            return 0
        for hook in self.on_assign:
            hook(wanted)
        caches: dict[int, PartitionCache] = {}
        try:
            for p in wanted:
                caches[p] = PartitionCache(
                    self._dir / f"p{p}", index_slots=self._index_slots, members_of=self._members_of
                )
            replayed = rebuild_partitions(
                self._bootstrap,
                self.topic,
                caches,
                self._codec,
                cancel=self._cancel,
                transactional=self._txn is not None,
            )
        except BaseException:
            with self._lock:
                for p in wanted:
                    self._assigning.pop(p, None)
            for cache in caches.values():
                cache.close()
            raise
        self._start_flusher()
        with self._lock:
            for p in wanted:
                if p in self._uncommitted:
                    caches[p].mark_uncommitted()
                # A suffix of the partition's acks, in offset order: applied after the
                # rebuild, each record is at least as new as what the rebuild read.
                for records, next_offset in self._assigning.pop(p, ()):
                    caches[p].apply(records, next_offset)
            self._caches.update(caches)
        return sum(replayed.values())

    def revoke(self, partition: int) -> None:
        # Closed under the lock that the ack hook holds while it writes: a delivery
        # report being applied on the producer's thread finishes first, and one that
        # comes later finds the partition gone (its next owner replays it from the topic).
        with self._lock:
            cache = self._caches.pop(partition, None)
            if cache is not None:
                cache.close()

    @property
    def partitions(self) -> list[int]:
        return sorted(self._caches)

    def _cache(self, partition: int) -> PartitionCache:
        cache = self._caches.get(partition)
        if cache is None:
            raise KeyError(f"ActionState partition {partition} is not assigned to this worker")
        return cache

    # -- reads --------------------------------------------------------------------------
    def fresh(self, key: str, seq: int, partition: int) -> bool:
        cache = self._caches.get(partition)
        return cache is not None and cache.holds_nothing_of(key, seq)

    def resolve(self, ref: ActionRef) -> ActionRef:
        cache = self._caches.get(ref.partition)
        if cache is not None and not cache.has_legacy:
            return ref  # no pre-v5 entry in this partition: nothing to continue
        return super().resolve(ref)

    def _decode(self, key: bytes, value: bytes) -> JournalEntry:
        return self._codec.decode(key, value)

    def calls(self, ref: ActionRef) -> dict[int, CallEntry]:
        rows = self._cache(ref.partition).scan(keys.calls_prefix(ref))
        out: dict[int, CallEntry] = {}
        for key, value in rows:
            entry = self._decode(key, value)
            if isinstance(entry, CallEntry):
                out[entry.index] = entry
        return out

    def done(self, ref: ActionRef) -> ActionDone | None:
        raw_key = keys.done_key(ref)
        cache = self._cache(ref.partition)
        raw = cache.get(raw_key)
        if raw is None:
            return self._done_in_group(cache, raw_key, ref)
        entry = self._decode(raw_key, raw)
        return entry if isinstance(entry, ActionDone) else None

    def _done_in_group(
        self, cache: PartitionCache, raw_key: bytes, ref: ActionRef
    ) -> ActionDone | None:
        group_key = cache.group_of(raw_key)
        if group_key is None:
            return None
        raw = cache.db.get(group_key)
        if raw is None:
            return None
        group = self._decode(group_key, raw)
        if isinstance(group, CompletionGroup):
            for done in group.dones:
                if done.ref == ref:
                    return done
        return None

    def _members_of(self, key: bytes, value: bytes) -> list[bytes]:
        """The done keys of the completion group ``key``/``value`` (PartitionCache)."""
        members = self._pending_groups.pop(key, None)
        if members is not None:
            return members
        entry = self._decode(key, value)
        if not isinstance(entry, CompletionGroup):
            return []
        return [keys.done_key(d.ref) for d in entry.dones]

    def memory(self, key: str, partition: int) -> MemorySnapshot | None:
        raw_key = keys.memory_key(key)
        raw = self._cache(partition).db.get(raw_key)
        if raw is None:
            return None
        entry = self._decode(raw_key, raw)
        return entry if isinstance(entry, MemorySnapshot) else None

    def progress(self, topic: str, partition: int) -> InputProgress | None:
        raw_key = keys.progress_key(topic, partition)
        raw = self._cache(partition).db.get(raw_key)
        if raw is None:
            return None
        entry = self._decode(raw_key, raw)
        return entry if isinstance(entry, InputProgress) else None

    def timer(self, probe: TimerEntry) -> TimerEntry | None:
        raw_key = keys.timer_key(probe)
        raw = self._cache(probe.partition).db.get(raw_key)
        if raw is None:
            return None
        entry = self._decode(raw_key, raw)
        return entry if isinstance(entry, TimerEntry) else None

    def timers(self, partition: int) -> list[TimerEntry]:
        out = []
        for key, value in self._cache(partition).scan(keys.TIMERS_PREFIX):
            entry = self._decode(key, value)
            if isinstance(entry, TimerEntry):
                out.append(entry)
        return out

    # -- writes -------------------------------------------------------------------------
    def append(self, entries: Sequence[JournalEntry | Tombstone], partition: int) -> Future[None]:
        if self.ownership is not None:
            self.ownership.check_partition(partition, "journal write")
        # Every action run appends (its ActionDone at least), nearly always one entry.
        encode, key_of = self._codec.encode, keys.entry_key_bytes
        producer = self._producer
        if self._txn is not None and not isinstance(entries[-1], _CALL_JOURNAL):
            producer = self._txn
            if partition not in self._uncommitted:
                self._mark_uncommitted(partition)
        if len(entries) == 1:
            entry = entries[0]
            value = None if isinstance(entry, Tombstone) else encode(entry)
            return producer.send(self.topic, value, key=key_of(entry), partition=partition)
        # A batch's ActionDones, emitted markers or effects: one future for the group.
        records = [(key_of(e), None if isinstance(e, Tombstone) else encode(e)) for e in entries]
        return producer.send_all(self.topic, records, partition=partition)

    def append_group(self, group: CompletionGroup) -> Future[None]:
        """Append one completion group (its members found by their done keys once it
        is acked); as standalone ActionDones when the codec writes a schema before v7."""
        if not self._groups_written:
            return super().append_group(group)
        key = keys.entry_key_bytes(group)
        self._pending_groups[key] = [keys.done_key(d.ref) for d in group.dones]
        try:
            return self.append([group], group.partition)
        except BaseException:
            self._pending_groups.pop(key, None)
            raise

    def _mark_uncommitted(self, partition: int) -> None:
        with self._lock:
            cache = self._caches.get(partition)
            if cache is not None:
                cache.mark_uncommitted()
            # A partition being assigned: marked when its cache opens (assign).
            self._uncommitted.add(partition)

    def note(self, entries: Sequence[JournalEntry | Tombstone], partition: int) -> None:
        if self.ownership is not None and not self.ownership.holds(partition):
            return  # an emitted marker is a hint: the next owner looks the outputs up
        if self._txn is not None:
            # Exactly-once: outputs commit with their ActionDone, so a committed
            # ActionDone's outputs are in the log; no emitted marker is needed.
            return
        encode, key_of = self._codec.encode, keys.entry_key_bytes
        records = [(key_of(e), None if isinstance(e, Tombstone) else encode(e)) for e in entries]
        self._producer.send_untracked(self.topic, records, partition)

    def forget_firing(self, timer: TimerEntry) -> Future[None]:
        cache = self._caches.get(timer.partition)
        if cache is None:
            return all_of([])
        doomed = [
            k
            for p in keys.record_prefixes(timer.key, timer.seq)
            for k, _ in cache.scan(p)
            if timer.owns(keys.identity_fields(keys.decode_identity(k)).get("action", ""))
        ]
        return self._tombstone(doomed, timer.partition)

    def _tombstone(self, raw_keys: Sequence[bytes], partition: int) -> Future[None]:
        if self.ownership is not None:
            self.ownership.check_partition(partition, "journal tombstone")
        records = [(k, None) for k in raw_keys]
        return self._producer.send_all(self.topic, records, partition=partition)

    def remove_calls(self, ref: ActionRef, from_index: int) -> Future[None]:
        doomed = [
            k
            for k, _ in self._cache(ref.partition).scan(keys.calls_prefix(ref))
            if int(keys.decode_identity(k)[-1]) >= from_index
        ]
        return self._tombstone(doomed, ref.partition)

    def prune(self, key: str, seq: int, partition: int, topic: str = "") -> None:
        self.prune_records([(seq, key)], partition, topic)

    # -- two-phase obligations (v8) ---------------------------------------------------------
    def obligation(self, ref: ActionRef, index: int) -> TwoPhaseCall | None:
        cache = self._caches.get(ref.partition)
        if cache is None:
            return None
        raw_key = keys.obligation_key(ref, index)
        raw = cache.db.get(raw_key)
        if raw is None:
            return None
        entry = self._decode(raw_key, raw)
        return entry if isinstance(entry, TwoPhaseCall) else None

    def obligations(self, partition: int) -> list[TwoPhaseCall]:
        cache = self._caches.get(partition)
        if cache is None:
            return []
        out = []
        for key, value in cache.scan(keys.OBLIGATIONS_PREFIX):
            entry = self._decode(key, value)
            if isinstance(entry, TwoPhaseCall):
                out.append(entry)
        return out

    def _obligated(self, cache: PartitionCache, topic: str) -> set[tuple[int, str]]:
        """``(seq, key)`` of the records of ``topic`` with a live obligation: one
        prefix seek per commit, nothing when no two-phase call was ever made."""
        out = set()
        for raw, _ in cache.scan(keys.OBLIGATIONS_PREFIX):
            found = keys.obligation_record(raw)
            if found is not None and found[2] == topic:
                out.add((found[1], found[0]))
        return out

    def prune_settled(self, records: Sequence[tuple[int, str]], partition: int, topic: str) -> None:
        cache = self._caches.get(partition)
        if cache is None:
            return
        wanted = set(records)
        settled = [
            raw
            for raw, _ in cache.scan(keys.OBLIGATIONS_PREFIX)
            if (found := keys.obligation_record(raw)) is not None
            and found[2] == topic
            and (found[1], found[0]) in wanted
        ]
        self._prune_records(records, partition, topic, also=settled)

    def prune_records(
        self, records: Sequence[tuple[int, str]], partition: int, topic: str = ""
    ) -> None:
        cache = self._caches.get(partition)
        if cache is None:
            return
        # A record with a two-phase obligation keeps its journal (the evidence of its
        # completion) until the obligation is settled (durable/twophase.py).
        obligated = self._obligated(cache, topic) if topic else set()
        if obligated:
            self._held_back.update(
                (topic, partition, s, k) for s, k in records if (s, k) in obligated
            )
            records = [r for r in records if r not in obligated]
        self._prune_records(records, partition, topic)

    def _prune_records(
        self,
        records: Sequence[tuple[int, str]],
        partition: int,
        topic: str,
        also: Sequence[bytes] = (),
    ) -> None:
        cache = self._caches.get(partition)
        if cache is None:
            return
        # A partition that never held a pre-v5 entry has none to prune.
        legacy = (not topic or topic in self.legacy_topics) and cache.has_legacy
        doomed = cache.record_keys(records, topic, legacy=legacy) if topic else None
        if doomed is None:
            doomed = []
            if topic:
                doomed += cache.keys_under(
                    [p for seq, key in records for p in keys.record_prefixes(key, seq, topic)]
                )
            if legacy:
                doomed += [
                    k
                    for k in cache.keys_under(
                        [p for seq, key in records for p in keys.record_prefixes(key, seq)]
                    )
                    if keys.is_legacy(keys.decode_identity(k))
                ]
        if self.ownership is not None and not self.ownership.holds(partition):
            return  # pruning is the holder's: an entry left behind is only kept longer
        if topic:
            # Completion groups: a member's done key has no record of its own in the
            # topic; its group is tombstoned once its last member is committed.
            with self._lock:
                doomed = cache.pruned(doomed, records, topic)
        if also:
            doomed = [*doomed, *also]
        if not doomed:
            return
        # Nobody waits for these: a lost tombstone only leaves an entry behind, so the
        # whole commit's tombstones of a partition go as one untracked group.
        self._producer.send_untracked(self.topic, [(k, None) for k in doomed], partition)

    def pin(self, topic: str, partition: int, seq: int, key: str) -> None:
        """A kept record's ActionDones held by completion groups, appended on their own
        (not awaited): a group is tombstoned once its other members are committed, or
        forgotten below the completed-through marker on assignment, and the record's
        dead-letter replay must still find them."""
        cache = self._caches.get(partition)
        if cache is None or not cache.group_of_any():
            return
        copies = []
        for member in cache.members_of_records([(seq, key)], topic):
            group_key = cache.group_of(member)
            raw = cache.db.get(group_key) if group_key is not None else None
            if raw is None:
                continue
            group = self._decode(group_key, raw)  # type: ignore[arg-type]
            if isinstance(group, CompletionGroup):
                copies += [d for d in group.dones if keys.done_key(d.ref) == member]
        if copies and (self.ownership is None or self.ownership.holds(partition)):
            self.append(copies, partition)

    def prune_below(self, topic: str, partition: int, offset: int) -> int:
        """On assignment: forget the completion-group members of ``topic`` below
        ``offset`` (the completed-through marker: committed, maybe pruned by the last
        owner) and tombstone the groups left with none (a crash between a commit and
        its prune, or a lost tombstone, left them). How many."""
        cache = self._caches.get(partition)
        if cache is None or (self.ownership is not None and not self.ownership.holds(partition)):
            return 0
        keep = self._obligated(cache, topic)
        with self._lock:
            doomed = cache.drop_below(topic, offset, keep)
        if doomed:
            log.info(
                "%s[%d]: %d completion group(s) of records below completed-through marker "
                "%d left by the last owner: tombstoned", topic, partition, len(doomed), offset,
            )  # fmt: skip
        if doomed:
            self._producer.send_untracked(self.topic, [(k, None) for k in doomed], partition)
        return len(doomed)

    def _on_acked(self, acks: list[Ack]) -> None:
        by_partition: dict[int, list[Ack]] = {}
        for ack in acks:  # no setdefault: it would build a list per ack
            group = by_partition.get(ack.partition)
            if group is None:
                by_partition[ack.partition] = [ack]
            else:
                group.append(ack)
        for partition, group in by_partition.items():
            records: list[tuple[bytes, bytes | None]] = []
            for a in group:
                if a.records is None:
                    records.append((a.key, a.value))  # type: ignore[arg-type]
                else:  # a group of records (producer._Group)
                    records.extend(a.records)  # type: ignore[arg-type]
            # Under the lock that revoke() closes a cache with: a cache closed between
            # the lookup and the write failed every ack of this poll, other partitions'
            # durable records included. Only this thread and (rarely) a rebalance take it.
            with self._lock:
                cache = self._caches.get(partition)
                if cache is None:
                    pending = self._assigning.get(partition)
                    if pending is not None:  # being assigned: applied after its rebuild
                        pending.append((records, max(a.offset for a in group) + 1))
                    continue  # else revoked: the next owner replays it from the topic
                cache.apply(records, max(a.offset for a in group) + 1)

    # -- persistence of the caches ---------------------------------------------------------
    # The caches write nothing to RocksDB's write-ahead log (see state/cache.py): their
    # memtables are flushed at least every FLUSH_EVERY_S, also when no write comes to
    # trigger it (an idle worker), so that a crash never needs a replay reaching back to
    # tombstones compaction may have dropped. On a thread of its own, not a host's loop:
    # every host (worker, Faust, Spark backfill) gets it.
    def _start_flusher(self) -> None:
        with self._lock:
            if self._flusher is not None or self._closed.is_set():
                return
            self._flusher = threading.Thread(
                target=self._flush_loop, name="agents-stream-cache-flush", daemon=True
            )
            self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._closed.wait(FLUSH_EVERY_S / 4):
            self.flush_due()

    def flush_due(self) -> int:
        """Start flushing the caches whose live writes are older than FLUSH_EVERY_S;
        how many. Under the lock revoke() closes a cache with."""
        now = time.monotonic()
        flushed = 0
        with self._lock:
            for partition, cache in self._caches.items():
                try:
                    flushed += cache.flush_if_due(now)
                except Exception as exc:  # the next round tries again; a crash replays
                    log.warning("flushing the cache of partition %d: %s", partition, exc)
        return flushed

    def close(self) -> None:
        self._closed.set()
        with self._lock:  # as revoke(): not while the ack hook writes
            caches, self._caches = list(self._caches.values()), {}
            for cache in caches:
                cache.close()
