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

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = Rdict(str(path), options=_options())
        flag = self.db.get(LEGACY_KEY)
        if flag is None:  # a cache written before the flag existed: look once
            flag = b"1" if self._scan_legacy() else b"0"
            self.db[LEGACY_KEY] = flag
        self.has_legacy = flag == b"1"
        self._unsettled = False  # replayed batches not flushed yet

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

    def settle(self) -> None:
        """Persist what :meth:`apply` wrote with ``replay`` (flush the memtable)."""
        if self._unsettled:
            self.db.flush(wait=True)
            self._unsettled = False

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
