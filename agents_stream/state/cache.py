"""PartitionCache: the RocksDB view of one ActionState partition.

Keys are ActionState record keys (:mod:`agents_stream.durable.keys`); values the raw
record values; one write batch per applied batch of records. The cache remembers the
next topic offset it reflects (its checkpoint), so that a rebuild replays only the tail.

Nothing is written through RocksDB's write-ahead log: every entry comes from an
acknowledged ActionState record, so the topic is the log (as a Kafka Streams store's
changelog is). Each write batch holds its own checkpoint and memtables flush whole and in
order, so a process killed with entries still in memory reopens a consistent prefix (the
entries up to a flushed checkpoint) and the next rebuild replays the rest from the topic.
Memtables are flushed at least every ``FLUSH_EVERY_S`` seconds, which bounds that replay
far below how long a compacted topic keeps a tombstone (``delete.retention.ms``, a day
by default), and on close.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

log = logging.getLogger("agents_stream.state")
CHECKPOINT_KEY = b"\x00checkpoint"
# Set once the partition holds an input record's entry keyed in the pre-v5 (topic-less)
# layout: until then no action run can continue under a legacy identity, and the store
# skips the lookups that would find one (two reads and two scans per action run).
# Timer firings are keyed topic-less by design (their seq is negative) and do not count:
# they made every partition with a fired timer pay those lookups for every record.
LEGACY_KEY = b"\x00legacy"
# Present while the cache may hold records of a transaction not committed yet (an
# exactly-once worker applies its ActionDones and snapshots when the broker acks them, so
# that the key's next record sees them). A cache opened with it is cleared and rebuilt
# from the topic, read_committed: what it held of an aborted transaction is gone.
UNCOMMITTED_KEY = b"\x00uncommitted"
_RECORD_KINDS = frozenset(b"cat")  # first byte of call, done and truncation keys
_SEP = b"\x1f"
_SEP_STR = "\x1f"
_RECORD_HEADS = (b"c" + _SEP, b"a" + _SEP, b"t" + _SEP)  # call, done, truncation keys
_GROUP_HEAD = b"g" + _SEP  # a completion group (v7): the ActionDones of several records
# The done keys a completion group's record holds (``(key, value)`` of the group).
MembersOf = Callable[[bytes, bytes], Sequence[bytes]]
# Input records with live entries indexed per partition (~450 bytes each): the records
# in flight plus those finished since the last commit's pruning; 20k was passed by one
# partition draining at ~14k records/s with a 1 s commit interval.
SLOT_INDEX_LIMIT = 100_000
INDEX_RELOAD_AFTER = 10.0  # seconds between attempts to index again once past the limit
# A legacy key's fourth field is its action id (``kind key seq action ...``), which always
# holds a ``#``; a v5 key's is the input topic, which never does. An input record's seq
# is its offset, never negative (a timer firing's is). One C-level match per applied key
# instead of a split (a rebuild applies every record of the topic).
_LEGACY = re.compile(rb"[cat]\x1f[^\x1f]*\x1f(?!-)[^\x1f]*\x1f[^\x1f#]*#")


FLUSH_EVERY_S = 30.0

MEMORY_ENV = "AGENTS_STREAM_CACHE_MEMORY_MB"
DEFAULT_MEMORY_MB = 64

_UNLOGGED = WriteOptions()
_UNLOGGED.disable_wal = True  # type: ignore[method-assign,assignment]  # a property in rocksdict

_shared: tuple[Cache, WriteBufferManager] | None = None
_shared_lock = threading.Lock()


def _memory() -> tuple[Cache, WriteBufferManager]:
    """One block cache and one memtable budget for every partition cache of the process.

    RocksDB's defaults are per database (64 MB memtables, twice, plus a block cache), so
    a worker owning many partitions grew by hundreds of MB while draining a backlog.
    Memtables are costed to the shared cache, so the caches together stay near
    ``AGENTS_STREAM_CACHE_MEMORY_MB`` (default 64) however many partitions are owned.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            budget = int(float(os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY_MB) * 1024 * 1024)
            cache = Cache(budget)
            _shared = (
                cache,
                WriteBufferManager.new_write_buffer_manager_with_cache(budget // 2, False, cache),
            )
        return _shared


def _options() -> Options:
    cache, memtables = _memory()
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_manager(memtables)
    opts.set_write_buffer_size(8 * 1024 * 1024)
    opts.set_max_write_buffer_number(2)
    return opts


class PartitionCache:
    """RocksDB view of one ActionState partition."""

    def __init__(
        self, path: Path, *, index_slots: bool = True, members_of: MembersOf | None = None
    ) -> None:
        """``members_of``: the done keys of a completion group's record (the journal
        codec's reading); without it the cache keeps no group's membership (a reader
        that only scans)."""
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = Rdict(str(path), options=_options())
        if self.db.get(UNCOMMITTED_KEY) is not None:
            log.info(
                "%s: holds records of a transaction that may not have committed (its "
                "worker stopped in it): rebuilt from the topic",
                path,
            )
            for key in list(self.db.keys()):
                self.db.delete(key)
        flag = self.db.get(LEGACY_KEY)
        if flag is None:  # a cache written before the flag existed: look once
            flag = b"1" if self._scan_legacy() else b"0"
            self.db[LEGACY_KEY] = flag
        self.has_legacy = flag == b"1"
        self._unsettled = False  # replayed batches not flushed yet
        self._flush_due: float | None = None  # live writes in memory only: flush by then
        self._checkpoint = self._read_checkpoint()  # only apply() and clear() change it
        self._index_slots = index_slots
        self._dropped_at: float | None = None  # when the index was dropped past its limit
        self._slots = self._load_index() if index_slots else None
        self._members_of = members_of
        self._groups_stale = False  # a replay wrote group rows: membership read again
        self._groups: dict[bytes, int] = {}  # group key -> members not pruned
        self._group_of: dict[bytes, bytes] = {}  # member done key -> group key
        self._standalone: set[bytes] = set()  # members with a row of their own too
        self._load_groups()

    # -- completion groups (v7) ----------------------------------------------------------
    # A group record holds the ActionDones of several input records under one key of its
    # own. Its members are looked up by their own done keys, as standalone ActionDones
    # are: every member's done key maps to its group (``_group_of``) and is indexed as a
    # live per-record key, so the record is not fresh and a lookup knows where to read.
    # Pruning drops members one record at a time (:meth:`drop_members`); the group's key
    # is tombstoned once its last member is dropped. Membership lives in memory only,
    # read back from the group rows on open and after a rebuild.

    def _load_groups(self) -> None:
        self._groups, self._group_of, self._standalone = {}, {}, set()
        if self._members_of is None:
            return
        for key, value in self.rocksdb_scan(_GROUP_HEAD):
            self._add_group(key, self._members_of(key, value))
        # An ActionDone may also have a row of its own under its done key (an emitted
        # marker, written after the group): that row is pruned with a tombstone.
        self._standalone = {m for m in self._group_of if self.db.get(m) is not None}

    def _add_group(self, key: bytes, members: Sequence[bytes]) -> None:
        of = self._group_of
        if key in self._groups:  # the same group applied again (a replayed suffix)
            for member in [m for m, g in of.items() if g == key]:
                del of[member]
        of.update(dict.fromkeys(members, key))
        self._groups[key] = len(members)
        live = self._slots
        if live is not None:
            for member in members:
                if not _index_key(live, member):
                    self._slots = None  # past the limit: lookups read RocksDB
                    self._dropped_at = time.monotonic()
                    break

    def _drop_group(self, key: bytes) -> None:
        """The group's row is deleted: its members too (none are left when this cache
        pruned them itself; a tombstone from elsewhere, e.g. ``state tombstone``, may
        leave some)."""
        if self._groups.pop(key, 0):
            for member in [m for m, g in self._group_of.items() if g == key]:
                self._forget(member)

    def _forget(self, member: bytes) -> None:
        del self._group_of[member]
        if member in self._standalone:
            self._standalone.discard(member)  # its row's tombstone unindexes it
        else:
            self._unindex(member)

    def _unindex(self, key: bytes) -> None:
        live = self._slots
        if live is None:
            return
        record = _record_of(key)
        found = live.get(record) if record is not None else None
        if found is not None:
            found.discard(key)
            if not found and record is not None:
                del live[record]

    def group_of(self, done_key: bytes) -> bytes | None:
        """The key of the completion group holding the ActionDone of ``done_key``."""
        return self._group_of.get(done_key)

    def pruned(
        self, doomed: list[bytes], records: Sequence[tuple[int, str]], topic: str
    ) -> list[bytes]:
        """What to tombstone in the topic when input records ``(seq, key)`` of ``topic``
        are pruned, given their live keys ``doomed`` (:meth:`record_keys`, or a scan):
        ``doomed`` less the group members' done keys (no row of their own: forgotten
        here), plus the keys of the groups left with no member."""
        of = self._group_of
        if not of:
            return doomed
        if self._slots is None:  # no index: the members are not among ``doomed``
            doomed = doomed + self.members_of_records(records, topic)
        groups, standalone = self._groups, self._standalone
        out = []
        emptied = []
        for key in doomed:
            group = of.get(key)
            if group is None:
                out.append(key)
                continue
            del of[key]
            if key in standalone:
                standalone.discard(key)
                out.append(key)  # its own row too: tombstoned, unindexed on its ack
            else:
                self._unindex(key)
            left = groups[group] - 1
            groups[group] = left
            if not left:
                emptied.append(group)
        return out + emptied if emptied else out

    def group_of_any(self) -> bool:
        """Whether any completion group has a member here."""
        return bool(self._group_of)

    def members_of_records(self, records: Sequence[tuple[int, str]], topic: str) -> list[bytes]:
        """Without the index: the member done keys of ``records`` of ``topic``, by a
        pass over every member (the index is only dropped past SLOT_INDEX_LIMIT)."""
        heads = {f"a\x1f{key}\x1f{seq}\x1f{topic}\x1f".encode() for seq, key in records}
        return [m for m in self._group_of if m[: m.rfind(_SEP) + 1] in heads]

    def drop_below(
        self,
        topic: str,
        offset: int,
        keep: set[tuple[int, str]] | frozenset[tuple[int, str]] = frozenset(),
    ) -> list[bytes]:
        """Forget the group members of ``topic`` that are input records below ``offset``
        (the completed-through marker, on assignment: membership is read back whole from
        the group rows, members pruned before included); returns the keys of the groups
        with no member left, to tombstone (also those a crash between a commit and its
        prune, or a lost tombstone, left behind)."""
        head = _GROUP_HEAD + topic.encode() + _SEP
        groups = self._groups
        for member, key in list(self._group_of.items()):
            if key.startswith(head) and _seq_of(member) < offset:
                if keep and _seq_key(member) in keep:
                    continue  # a record with an open two-phase obligation: kept
                self._forget(member)
                groups[key] -= 1
        return [key for key, left in groups.items() if key.startswith(head) and left <= 0]

    # -- live per-record entries ----------------------------------------------------------
    # Every action run asks the cache whether it already ran (its ActionDone) and what it
    # journaled (its call slots), and every commit prunes the finished records' entries.
    # For a new record the answer is "nothing", and RocksDB finds that out the slow way:
    # a point read visits every table that may hold the key, and a seek walks each deleted
    # key after the prefix up to the next live one. Pruning tombstones every finished
    # record, and compaction drops the tombstones much later, so a worker that had pruned
    # 20k records spent ~4 ms per record on that seek (iterator bounds do not help:
    # rocksdict's are not raw keys). The live call, done and truncation keys, grouped by
    # input record (``key SEP seq SEP``), answer from memory instead. Kept exact: a put is
    # noted before RocksDB has it, a delete after (a stale "maybe" only costs the read).
    # Only worth it where records are pruned (``index_slots``); past SLOT_INDEX_LIMIT
    # records the index is dropped and every lookup reads RocksDB, until a later write
    # that prunes loads it again (at most every INDEX_RELOAD_AFTER seconds: a dropped
    # index stayed dropped before, and a worker that once had a burst of live records
    # stayed slow). A replay (rebuild) drops it too and :meth:`settle` loads it once
    # from what lives at the end.

    def _load_index(self) -> dict[bytes, set[bytes]] | None:
        """The index of what RocksDB holds now; None past the limit. Only where nothing
        writes meanwhile: in the constructor, :meth:`settle` and :meth:`apply`."""
        live: dict[bytes, set[bytes]] = {}
        self._dropped_at = None
        it = self.db.iter()
        try:
            for head in _RECORD_HEADS:
                it.seek(head)
                while it.valid():
                    key = it.key()
                    if not key.startswith(head):
                        break
                    if not _index_key(live, key):
                        self._dropped_at = time.monotonic()
                        return None
                    it.next()
        finally:
            del it
        return live

    def may_hold(self, prefix: bytes) -> bool:
        """False when no live entry starts with ``prefix``, a per-record key or prefix
        (``keys.done_key``, ``keys.calls_prefix``, ``keys.record_prefixes``); True when
        one may (or ``prefix`` names no record, or there is no index)."""
        live = self._slots
        if live is None:
            return True
        record = _record_of(prefix)
        if record is None:
            return True
        found = live.get(record)
        if not found:
            return False
        if prefix in found:
            return True
        # A snapshot: the producer's thread may change the set meanwhile.
        return any(k.startswith(prefix) for k in tuple(found))

    def holds_nothing_of(self, key: str, seq: int) -> bool:
        """True when the live-entry index is loaded and has no entry of input record
        ``(key, seq)`` (of any topic or layout): an acked entry is indexed before its
        ack resolves, so what is not there was never written or is pruned. False
        without an index, and for a key containing the separator (its record id would
        not parse back the same way)."""
        live = self._slots
        if live is None or _SEP_STR in key:
            return False
        return f"{key}\x1f{seq}\x1f".encode() not in live

    def record_keys(
        self, records: Sequence[tuple[int, str]], topic: str, *, legacy: bool = False
    ) -> list[bytes] | None:
        """The live call, done and truncation keys of input records ``(seq, key)`` of
        ``topic`` (seq: the offset; with ``legacy`` also their topic-less pre-v5 ones):
        what :meth:`keys_under` finds under ``keys.record_prefixes``, with one lookup
        per record, for pruning. None without an index."""
        live = self._slots
        if live is None:
            return None
        out: list[bytes] = []
        for seq, key in records:
            tail = f"\x1f{key}\x1f{seq}\x1f".encode()
            # The record id is the tail without its first separator, unless the key
            # holds one: then it is what parsing a key of the record gives.
            record = tail[1:] if _SEP_STR not in key else _record_of(b"c" + tail)
            found = live.get(record)  # type: ignore[arg-type]
            if not found:
                continue
            v5 = tail + topic.encode() + b"\x1f"
            for k in tuple(found):  # a snapshot: acks change the set meanwhile
                if k.startswith(v5, 1) or (legacy and k.startswith(tail, 1) and _is_legacy(k)):
                    out.append(k)
        return out

    def clear(self) -> None:
        """Delete every entry (the topic was recreated: rebuilt from scratch)."""
        for key in list(self.db.keys()):
            self.db.delete(key)
        self._checkpoint = 0
        if self._slots is not None:
            self._slots = {}
        self._groups, self._group_of, self._standalone = {}, {}, set()

    def mark_uncommitted(self) -> None:
        """Before the first record of a transaction reaches this cache (see
        UNCOMMITTED_KEY). Unlogged like every write: RocksDB persists them in order, so a
        record applied later is never on disk without the mark."""
        self.db.put(UNCOMMITTED_KEY, b"1", _UNLOGGED)

    def mark_committed(self) -> None:
        """Every transactional record this cache holds is committed."""
        self.db.delete(UNCOMMITTED_KEY, _UNLOGGED)

    @property
    def checkpoint(self) -> int:
        """The next topic offset this cache reflects."""
        return self._checkpoint

    def _read_checkpoint(self) -> int:
        raw = self.db.get(CHECKPOINT_KEY)
        return int(raw) if raw is not None else 0

    def apply(
        self,
        records: Sequence[tuple[bytes, bytes | None]],
        next_offset: int,
        *,
        replay: bool = False,
    ) -> None:
        """Write ``records`` (None: delete) and move the checkpoint, in one write batch.

        No write goes through RocksDB's write-ahead log (a third of a write's cost, see
        the module docstring): a crash loses a suffix of batches together with their
        checkpoint, and the next rebuild replays them from the topic. ``replay`` (a
        rebuild) drops the index, which :meth:`settle` loads again."""
        live = self._slots
        if replay:
            self._slots = live = None  # loaded once by settle(): cheaper than noting writes
            self._dropped_at = None
            self._groups_stale = True
        elif (
            live is None
            and self._dropped_at is not None
            and time.monotonic() - self._dropped_at >= INDEX_RELOAD_AFTER
            and any(v is None for _, v in records)  # pruning: fewer records live now
        ):
            # This thread is the only writer: nothing changes RocksDB during the scan.
            self._slots = live = self._load_index()
            if live is not None:
                log.info("%s: live-entry index loaded again (%d records)", self.path, len(live))
        writes: dict[bytes, bytes | None] = {}
        of = self._group_of
        if live is not None:
            # Per-record keys, the last write of each (as in RocksDB); puts noted now.
            writes = {k: v for k, v in records if k[:2] in _RECORD_HEADS}
            for key, value in writes.items():
                if value is None:
                    continue
                if key in of:  # a group member's own row (an emitted marker)
                    self._standalone.add(key)
                if not _index_key(live, key):
                    self._slots = live = None  # past the limit
                    self._dropped_at = time.monotonic()
                    log.info(
                        "%s: over %d input records with live journal entries: lookups read "
                        "RocksDB until pruning brings it under (checked every %gs)",
                        self.path,
                        SLOT_INDEX_LIMIT,
                        INDEX_RELOAD_AFTER,
                    )
                    break
        groups = None
        if not replay and self._members_of is not None:
            groups = [(k, v) for k, v in records if k[:2] == _GROUP_HEAD]
            for key, value in groups:
                if value is not None:  # members noted before RocksDB has the group
                    self._add_group(key, self._members_of(key, value))
            if of and live is None:  # a member's own row (an emitted marker): by key
                self._standalone.update(
                    k for k, v in records if v is not None and k in of and k[:2] == b"a\x1f"
                )
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        for key, value in records:
            if value is None:
                batch.delete(key)
            else:
                put(key, value)
        # Only a key put counts: a deleted legacy entry leaves nothing to look up.
        legacy = self.has_legacy or any(
            map(_LEGACY.match, [k for k, v in records if v is not None])
        )
        self._write(batch, legacy, next_offset, replay)
        if groups:
            for key, value in groups:
                if value is None:
                    self._drop_group(key)
        live = self._slots  # a group's members may have passed the limit
        if live is not None:  # deletes noted once RocksDB has them
            for key, value in writes.items():
                if value is None:
                    record = _record_of(key)
                    found = live.get(record) if record is not None else None
                    if found is not None:
                        found.discard(key)
                        if not found and record is not None:
                            del live[record]

    def replay(self, keys: list[bytes], values: list[bytes | None], next_offset: int) -> None:
        """``apply(zip(keys, values), next_offset, replay=True)`` for a rebuild's batch
        taken column by column: no pair per record, and the puts of a batch without
        tombstones in one C-level pass (a rebuild writes every record of the topic)."""
        self._slots = None  # loaded once by settle()
        self._dropped_at = None
        self._groups_stale = True
        batch = WriteBatch(raw_mode=True)
        if None in values:
            puts = []
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
                    puts.append(key)
        else:
            deque(map(batch.put, keys, values), maxlen=0)
            puts = keys
        self._write(batch, self.has_legacy or any(map(_LEGACY.match, puts)), next_offset, True)

    def _write(self, batch: WriteBatch, legacy: bool, next_offset: int, replay: bool) -> None:
        """Write ``batch`` with the legacy flag and checkpoint it moves (see apply)."""
        if legacy and not self.has_legacy:
            batch.put(LEGACY_KEY, b"1")
        if next_offset > self._checkpoint:
            batch.put(CHECKPOINT_KEY, str(next_offset).encode())
        if replay:
            self.db.write(batch, _UNLOGGED)
            self._unsettled = True
        else:
            if self._unsettled:
                self.settle()
            self.db.write(batch, _UNLOGGED)
            if self._flush_due is None:
                self._flush_due = time.monotonic() + FLUSH_EVERY_S
        self._checkpoint = max(self._checkpoint, next_offset)
        self.has_legacy = legacy

    def flush_if_due(self, now: float) -> bool:
        """Start flushing the memtables (in RocksDB's background) if live writes have
        been in memory only for ``FLUSH_EVERY_S``; whether it did. Never while another
        thread writes or closes this cache (the store's lock)."""
        due = self._flush_due
        if due is None or now < due:
            return False
        self._flush_due = None
        self.db.flush(wait=False)
        return True

    def settle(self) -> None:
        """Persist what :meth:`apply` wrote with ``replay`` (flush the memtable); index
        the live per-record entries again (a replay drops the index: what lives at the
        end is what counts)."""
        if self._unsettled:
            self.db.flush(wait=True)
            self._unsettled = False
        if self._index_slots and self._slots is None:
            self._slots = self._load_index()
            self._groups_stale = True  # their members are indexed too
        if self._groups_stale:
            self._groups_stale = False
            self._load_groups()

    def _scan_legacy(self) -> bool:
        it = self.db.iter()
        try:
            for kind in sorted(_RECORD_KINDS):
                prefix = bytes([kind]) + _SEP
                it.seek(prefix)
                while it.valid():
                    key = it.key()
                    if not key.startswith(prefix):
                        break
                    if _is_legacy(key):
                        return True
                    it.next()
            return False
        finally:
            del it

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``; a per-record key the index knows is absent is not read."""
        return self.db.get(key) if self.may_hold(key) else None

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Entries whose key starts with ``prefix``, in key order."""
        return self.rocksdb_scan(prefix) if self.may_hold(prefix) else []

    def rocksdb_scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """:meth:`scan` without the index: what RocksDB holds under ``prefix``."""
        out = []
        it = self.db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            out.append((key, it.value()))
            it.next()
        del it
        return out

    def keys_under(self, prefixes: list[bytes]) -> list[bytes]:
        """Keys starting with any of ``prefixes`` (no values), for each prefix in order:
        from the index when the prefixes are per-record ones, else with one iterator (a
        commit prunes three prefixes per record, and opening an iterator costs more than
        seeking one; values of ActionDones, with their outputs, are never copied out)."""
        ordered = sorted(prefixes)
        live = self._slots
        if live is not None:
            records = [_record_of(p) for p in ordered]
            if None not in records:
                out: list[bytes] = []
                for prefix, record in zip(ordered, records, strict=True):
                    found = live.get(record)  # type: ignore[arg-type]
                    if found:
                        out += sorted(k for k in tuple(found) if k.startswith(prefix))
                return out
        out = []
        it = self.db.iter()
        try:
            for prefix in ordered:  # seeks move forward through the table
                it.seek(prefix)
                while it.valid():
                    key = it.key()
                    if not key.startswith(prefix):
                        break
                    out.append(key)
                    it.next()
        finally:
            del it
        return out

    def close(self) -> None:
        # RocksDB flushes unlogged memtables when it closes; said here, not assumed.
        self.db.flush(wait=True)
        self.db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


def _record_of(key: bytes) -> bytes | None:
    """``key SEP seq SEP`` of a per-record key or prefix: the same for every entry of
    one input record, whatever the layout (v5 or legacy) and the topic; None when
    ``key`` is not one or stops before its seq."""
    if key[:2] not in _RECORD_HEADS:
        return None
    end = key.find(_SEP, 2)
    if end < 0:
        return None
    end = key.find(_SEP, end + 1)
    return key[2 : end + 1] if end >= 0 else None


def _seq_of(key: bytes) -> int:
    """The seq of a per-record key (``kind key seq ...``); -1 when it has none."""
    record = _record_of(key)
    if record is None:
        return -1
    seq = record[:-1].rpartition(_SEP)[2]
    return int(seq) if seq.lstrip(b"-").isdigit() else -1


def _seq_key(key: bytes) -> tuple[int, str]:
    """``(seq, key)`` of a per-record key."""
    record = _record_of(key) or b""
    name, _, seq = record[:-1].rpartition(_SEP)
    return (int(seq) if seq.lstrip(b"-").isdigit() else -1, name.decode())


def _index_key(live: dict[bytes, set[bytes]], key: bytes) -> bool:
    """Index per-record ``key``; False when that would pass the limit."""
    # _record_of, inlined: called for every journal record acked.
    end = key.find(_SEP, 2)
    end = key.find(_SEP, end + 1) if end >= 0 else -1
    if end < 0:  # a key cut short: never written by this library
        return True
    record = key[2 : end + 1]
    found = live.get(record)
    if found is None:
        if len(live) >= SLOT_INDEX_LIMIT:
            return False
        live[record] = found = set()
    found.add(key)
    return True


def _is_legacy(key: bytes) -> bool:
    """An input record's call/done/truncation key without the input topic (``kind key
    seq action ...``): its fourth field is the action id, which always contains ``#``
    (topics never do), and its seq is not negative (a timer firing's is)."""
    return _LEGACY.match(key) is not None
