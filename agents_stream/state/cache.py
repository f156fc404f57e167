"""PartitionCache: the RocksDB view of one ActionState partition.

Keys are ActionState record keys (:mod:`agents_stream.durable.keys`); values the raw
record values; one write batch per applied batch of records. The cache remembers the
next topic offset it reflects (its checkpoint), so that a rebuild replays only the tail.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

CHECKPOINT_KEY = b"\x00checkpoint"


class PartitionCache:
    """RocksDB view of one ActionState partition."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.path = path
        self.db = Rdict(str(path), options=opts)

    @property
    def checkpoint(self) -> int:
        raw = self.db.get(CHECKPOINT_KEY)
        return int(raw) if raw is not None else 0

    def apply(self, records: Sequence[tuple[bytes, bytes | None]], next_offset: int) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in records:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if next_offset > self.checkpoint:
            batch.put(CHECKPOINT_KEY, str(next_offset).encode())
        self.db.write(batch)

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

    def close(self) -> None:
        self.db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
