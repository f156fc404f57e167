"""The console's index of an ActionState topic, kept current by one tailing consumer.

The topic is read once from the beginning, then followed: each record replaces its key's
entry (a tombstone removes it), as compaction will. Pages read the index, never the
topic: a key's history is a lookup by record key, PENDING calls a dictionary of their
own, a call id or an output identity one lookup each -- no scan per click. A value that
does not decode is kept as :class:`Unreadable` (raw key, partition, offset, reason) and
shown as such; it never stops the tailer or a page.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..durable.journal import ActionDone, CallEntry, CallStatus, JournalEntry, MemorySnapshot
from ..durable.keys import RECORD_KINDS, decode_identity
from ..durable.output_identity import output_prefix

log = logging.getLogger(__name__)

# Kinds of ActionState key that belong to a record key: calls, action runs, truncations
# (RECORD_KINDS) and memory (timers are keyed by partition first).
_KEYED = frozenset({*RECORD_KINDS, "m"})


@dataclass(frozen=True)
class Located:
    """A decoded journal entry and where its latest value is."""

    entry: JournalEntry
    partition: int
    offset: int


@dataclass(frozen=True)
class Unreadable:
    """A journal record whose value could not be decoded."""

    raw_key: bytes
    key: str  # the record key its identity names, else the raw key shown as text
    partition: int
    offset: int
    reason: str


def record_key(raw_key: bytes) -> str | None:
    """The record key an ActionState key belongs to (None: not an identity this
    version knows)."""
    try:
        parts = decode_identity(raw_key)
    except (UnicodeDecodeError, ValueError):
        return None
    if len(parts) < 2 or parts[0] not in _KEYED:
        return None  # a completed-through marker (per partition) or unknown
    return parts[1]


# What the index keeps of a live record: partition, offset, value bytes, kind (the
# counts' column). The bytes, not the decoded entry: a decoded CallEntry costs several
# times its encoding, and a page decodes only the few entries of its key.
_Stored = tuple[int, int, bytes, str]


def _kind(entry: JournalEntry) -> str:
    if isinstance(entry, CallEntry):
        return entry.status.value
    if isinstance(entry, ActionDone):
        return "completed"
    if isinstance(entry, MemorySnapshot):
        return "memory"
    return "other"


class JournalIndex:
    """Live entries of one ActionState topic, by record key, call id, output identity,
    plus the PENDING calls and counts per kind, all kept up to date as records arrive
    (nothing is scanned when a page is built). Thread-safe: the tailer applies, pages
    read."""

    def __init__(self, decode: Callable[[bytes, bytes], JournalEntry], origin: str) -> None:
        self._decode = decode
        self._origin = origin  # what outputs' identities start with (the app id)
        self._lock = threading.Lock()
        self._live: dict[bytes, _Stored] = {}
        self._by_key: dict[str, set[bytes]] = defaultdict(set)
        self._pending: dict[bytes, CallEntry] = {}
        self._unreadable: dict[bytes, Unreadable] = {}
        self._call_ids: dict[str, str] = {}
        self._outputs: dict[str, str] = {}
        self._counts: dict[str, int] = defaultdict(int)
        self.positions: dict[int, int] = {}  # next offset to read, per partition
        self.caught_up = False
        self.error: str | None = None  # why the tailer is not reading, if it is not

    # -- writes (the tailer) -------------------------------------------------------------
    def apply(self, raw_key: bytes, value: bytes | None, partition: int, offset: int) -> None:
        """Take one record of the topic (``value`` None: a tombstone)."""
        key = record_key(raw_key)
        with self._lock:
            self.positions[partition] = offset + 1
            self._forget(raw_key, key)
            if value is None:
                return
            try:
                entry = self._decode(raw_key, value)
            except Exception as exc:  # shown as unreadable, never fatal
                shown = key if key is not None else raw_key.decode("utf-8", "replace")
                reason = f"{type(exc).__name__}: {exc}"
                self._unreadable[raw_key] = Unreadable(raw_key, shown, partition, offset, reason)
                self._keep(raw_key, shown, (partition, offset, value, "unreadable"))
                return
            self._keep(raw_key, key, (partition, offset, value, _kind(entry)))
            self._index(raw_key, key, entry)

    def _keep(self, raw_key: bytes, key: str | None, stored: _Stored) -> None:
        self._live[raw_key] = stored
        self._counts[stored[3]] += 1
        if key is not None:
            self._by_key[key].add(raw_key)

    def _forget(self, raw_key: bytes, key: str | None) -> None:
        old = self._live.pop(raw_key, None)
        if old is None:
            return
        self._counts[old[3]] -= 1
        self._pending.pop(raw_key, None)
        bad = self._unreadable.pop(raw_key, None)
        shown = bad.key if bad is not None else key
        if shown is not None:
            keys = self._by_key.get(shown)
            if keys is not None:
                keys.discard(raw_key)
                if not keys:
                    del self._by_key[shown]

    def _index(self, raw_key: bytes, key: str | None, entry: JournalEntry) -> None:
        if key is None:
            return
        if isinstance(entry, CallEntry):
            if entry.call_id:
                self._call_ids[entry.call_id] = key
            if entry.status is CallStatus.PENDING:
                self._pending[raw_key] = entry
        elif isinstance(entry, ActionDone) and entry.outputs:
            self._outputs[output_prefix(self._origin, entry)] = key

    # -- reads (the pages) ---------------------------------------------------------------
    def entries_of(self, key: str) -> list[Located | Unreadable]:
        """``key``'s live entries, decoded (the unreadable ones as such)."""
        with self._lock:
            raws = [
                (raw, self._live[raw], self._unreadable.get(raw))
                for raw in self._by_key.get(key, ())
            ]
        out: list[Located | Unreadable] = []
        for raw, (partition, offset, value, _), bad in raws:
            if bad is not None:
                out.append(bad)
                continue
            try:
                out.append(Located(self._decode(raw, value), partition, offset))
            except Exception as exc:  # read once already: a codec that changed since
                reason = f"{type(exc).__name__}: {exc}"
                out.append(Unreadable(raw, key, partition, offset, reason))
        return out

    def pending(self) -> list[CallEntry]:
        """PENDING calls, oldest first."""
        with self._lock:
            calls = list(self._pending.values())
        return sorted(calls, key=lambda c: (c.started_ms, c.ref.key, c.ref.seq, c.index))

    def unreadable(self) -> list[Unreadable]:
        with self._lock:
            return sorted(self._unreadable.values(), key=lambda u: (u.partition, u.offset))

    def find(self, query: str) -> str | None:
        """The record key that ``query`` names: a key, a call id, or an output identity
        (``x-agents-stream-output``, with or without its index)."""
        query = query.strip()
        with self._lock:
            if query in self._by_key:
                return query
            if query in self._call_ids:
                return self._call_ids[query]
            prefix = query if query.endswith("/") else query.rpartition("/")[0] + "/"
            return self._outputs.get(prefix) or self._outputs.get(query + "/")

    def stats(self) -> dict[str, int]:
        """Live entries, keys, and entries per kind (PENDING, SUCCEEDED, FAILED,
        completed, memory, unreadable, other)."""
        with self._lock:
            counts = {kind: n for kind, n in self._counts.items() if n}
            return {"entries": len(self._live), "keys": len(self._by_key), **counts}


class JournalTailer:
    """Reads ``topic`` from the beginning into ``index`` and follows it, on a thread of
    its own, until :meth:`stop`. A missing topic or a broker error is said on the index
    (``index.error``) and retried; it never ends the console."""

    def __init__(self, bootstrap: str, topic: str, index: JournalIndex) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._index = index
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal-tailer", daemon=True)

    def start(self) -> JournalTailer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception as exc:  # retried: the console stays up
                self._index.error = f"{type(exc).__name__}: {exc}"
                log.warning("reading %s: %s (retrying)", self._topic, exc)
                self._stop.wait(2.0)

    def _follow(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        from ..kafka.config import reader_config

        group = f"agents-stream-console-{uuid.uuid4().hex[:8]}"
        consumer = Consumer(reader_config(self._bootstrap, {"group.id": group, "log_level": 0}))
        try:
            meta = consumer.list_topics(self._topic, timeout=10).topics.get(self._topic)
            if meta is None or meta.error is not None or not meta.partitions:
                reason = meta.error if meta is not None and meta.error else "no partitions"
                raise LookupError(f"topic {self._topic!r} cannot be read yet: {reason}")
            index = self._index
            starts = {p: index.positions.get(p, OFFSET_BEGINNING) for p in meta.partitions}
            consumer.assign([TopicPartition(self._topic, p, o) for p, o in starts.items()])
            index.error = None
            at_end: set[int] = set()
            while not self._stop.is_set():
                msgs: list[Any] = consumer.consume(500, 0.5)
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            at_end.add(msg.partition())
                            index.caught_up = at_end >= set(meta.partitions)
                            continue
                        raise RuntimeError(str(err))
                    index.apply(msg.key() or b"", msg.value(), msg.partition(), msg.offset())
        finally:
            consumer.close()

    def wait_caught_up(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._index.caught_up and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._index.caught_up
