"""PartitionCache: the RocksDB view of one ActionState partition.

Keys are ActionState record keys (:mod:`agents_stream.durable.keys`); values the raw
record values; one write batch per applied batch of records. The cache remembers the
next topic offset it reflects (its checkpoint), so that a rebuild replays only the tail.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Sequence
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

CHECKPOINT_KEY = b"\x00checkpoint"
# Set once the partition holds an entry keyed in the pre-v5 (topic-less) layout: until
# then no action run can continue under a legacy identity, and the store skips the
# lookups that would find one (two RocksDB reads and two scans per action run).
LEGACY_KEY = b"\x00legacy"
_RECORD_KINDS = frozenset(b"cat")  # first byte of call, done and truncation keys
_SEP = b"\x1f"
_CALL_PREFIX = b"c" + _SEP
SLOT_INDEX_LIMIT = 20_000  # action runs with live call slots indexed per partition
# A legacy key's fourth field is its action id (``kind key seq action ...``), which always
# holds a ``#``; a v5 key's is the input topic, which never does. One C-level match per
# applied key instead of a split (a rebuild applies every record of the topic).
_LEGACY = re.compile(rb"[cat]\x1f[^\x1f]*\x1f[^\x1f]*\x1f[^\x1f#]*#")


MEMORY_ENV = "AGENTS_STREAM_CACHE_MEMORY_MB"
DEFAULT_MEMORY_MB = 64

_UNLOGGED = WriteOptions()
_UNLOGGED.disable_wal = True

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

    def __init__(self, path: Path, *, index_slots: bool = True) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = Rdict(str(path), options=_options())
        flag = self.db.get(LEGACY_KEY)
        if flag is None:  # a cache written before the flag existed: look once
            flag = b"1" if self._scan_legacy() else b"0"
            self.db[LEGACY_KEY] = flag
        self.has_legacy = flag == b"1"
        self._unsettled = False  # replayed batches not flushed yet
        self._index_slots = index_slots
        self._slots = self._load_slots() if index_slots else None

    # -- live call slots ------------------------------------------------------------------
    # An action run's first call reads its journaled slots with a prefix scan. For a new
    # record there are none, and the seek walks every deleted key after the prefix up to
    # the next live one: pruning tombstones a finished record's slots, compaction drops
    # the tombstones only much later, so a worker that had pruned 20k records spent ~4 ms
    # per record on that seek (iterator bounds do not help: rocksdict's are not raw keys).
    # The live slot keys, by action run, answer "none" from memory instead. Kept exact:
    # a put is noted before RocksDB has it, a delete after (a stale "maybe" only costs the
    # scan). Only worth it where records are pruned (``index_slots``); past
    # SLOT_INDEX_LIMIT runs the index is dropped and every lookup scans.

    def _load_slots(self) -> dict[bytes, set[bytes]] | None:
        slots: dict[bytes, set[bytes]] = {}
        it = self.db.iter()
        try:
            it.seek(_CALL_PREFIX)
            while it.valid():
                key = it.key()
                if not key.startswith(_CALL_PREFIX):
                    break
                if not self._add_slot(slots, key):
                    return None
                it.next()
        finally:
            del it
        return slots

    @staticmethod
    def _add_slot(slots: dict[bytes, set[bytes]], key: bytes) -> bool:
        """Index ``key``; False when that would pass the limit."""
        run = key[: key.rfind(_SEP) + 1]
        found = slots.get(run)
        if found is None:
            if len(slots) >= SLOT_INDEX_LIMIT:
                return False
            slots[run] = found = set()
        found.add(key)
        return True

    def may_hold_calls(self, prefix: bytes) -> bool:
        """False when no call slot lives under ``prefix`` (``keys.calls_prefix``)."""
        slots = self._slots
        return slots is None or prefix in slots

    def _slot_writes(self, records: Sequence[tuple[bytes, bytes | None]]) -> dict[bytes, bool]:
        """Call slots ``records`` write: key -> whether it lives afterwards (the last
        write of a key in the batch wins, as in RocksDB)."""
        if self._slots is None:
            return {}
        return {k: v is not None for k, v in records if k[:2] == _CALL_PREFIX}

    def _note_puts(self, writes: dict[bytes, bool]) -> None:
        slots = self._slots
        if slots is None:
            return
        for key, lives in writes.items():
            if lives and not self._add_slot(slots, key):
                self._slots = None
                return

    def _note_deletes(self, writes: dict[bytes, bool]) -> None:
        slots = self._slots
        if slots is None:
            return
        for key, lives in writes.items():
            if not lives:
                run = key[: key.rfind(_SEP) + 1]
                found = slots.get(run)
                if found is not None:
                    found.discard(key)
                    if not found:
                        del slots[run]

    def clear(self) -> None:
        """Delete every entry (the topic was recreated: rebuilt from scratch)."""
        for key in list(self.db.keys()):
            self.db.delete(key)
        if self._slots is not None:
            self._slots = {}

    @property
    def checkpoint(self) -> int:
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

        ``replay`` (a rebuild) skips RocksDB's write-ahead log, a third of the write's
        cost: each batch holds its own checkpoint and memtables flush whole and in order,
        so a crash loses a suffix of batches together with their checkpoint, and the next
        rebuild replays them. :meth:`settle` must persist the replayed batches before the
        next logged write: a log replayed over a lost memtable would keep that write
        (and its later checkpoint) without the records before it."""
        slot_writes = self._slot_writes(records)
        self._note_puts(slot_writes)
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
        if legacy and not self.has_legacy:
            batch.put(LEGACY_KEY, b"1")
        if next_offset > self.checkpoint:
            batch.put(CHECKPOINT_KEY, str(next_offset).encode())
        if replay:
            self.db.write(batch, _UNLOGGED)
            self._unsettled = True
        else:
            if self._unsettled:
                self.settle()
            self.db.write(batch)
        self.has_legacy = legacy
        self._note_deletes(slot_writes)

    def settle(self) -> None:
        """Persist what :meth:`apply` wrote with ``replay`` (flush the memtable); index
        the live call slots again if a replay passed the limit on its way (its records
        were pruned later in the topic: what lives at the end is what counts)."""
        if self._unsettled:
            self.db.flush(wait=True)
            self._unsettled = False
        if self._index_slots and self._slots is None:
            self._slots = self._load_slots()

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

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
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
        """Keys starting with any of ``prefixes`` (no values), with one iterator: a
        commit prunes three prefixes per record, and opening an iterator costs more than
        seeking one (values of ActionDones, with their outputs, are never copied out)."""
        out: list[bytes] = []
        it = self.db.iter()
        try:
            for prefix in sorted(prefixes):  # seeks move forward through the table
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
        self.db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


def _is_legacy(key: bytes) -> bool:
    """A call/done/truncation key without the input topic (``kind key seq action ...``):
    its fourth field is the action id, which always contains ``#`` (topics never do)."""
    return _LEGACY.match(key) is not None
