"""The console's index of an ActionState topic, kept current by one tailing consumer.

The topic is read once from the beginning, then followed: each record replaces its key's
entry (a tombstone removes it), as compaction will. Pages read the index, never the
topic: a key's history is a lookup by record key, PENDING calls a dictionary of their
own, a call id or an output identity one lookup each -- no scan per click.

Reconciled calls: the journal says who wrote each value, not why, but the index reads a
slot's PENDING value before its outcome, and the two tell who settled it
(:func:`settlement`). Where the PENDING value was compacted away before the console read
it, the call shows as a plain outcome: nothing in the journal says more. A value that
does not decode is kept as :class:`Unreadable` (raw key, partition, offset, reason) and
shown as such; it never stops the tailer or a page.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    CompletionGroup,
    JournalEntry,
    MemorySnapshot,
    TwoPhaseCall,
)
from ..durable.keys import RECORD_KINDS, call_key, decode_identity, done_key, identity_fields
from ..durable.output_identity import output_prefix

log = logging.getLogger(__name__)

# Kinds of ActionState key that belong to a record key: calls, action runs, truncations
# (RECORD_KINDS), two-phase obligations (``x``, v8) and memory (timers are keyed by
# partition first).
_KEYED = frozenset({*RECORD_KINDS, "x", "m"})


@dataclass(frozen=True)
class Located:
    """A decoded journal entry and where its latest value is."""

    entry: JournalEntry
    partition: int
    offset: int
    settled: Settlement | None = None  # a call whose PENDING value the index read


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


@dataclass(frozen=True)
class Settlement:
    """How a PENDING call this index read got its outcome, inferred from the two values
    of its slot (the journal has no such field; see :func:`settlement`)."""

    how: Literal["reconciler", "own run", "executed again"]
    pending_worker: str  # who journaled PENDING
    outcome_worker: str  # who journaled the outcome

    def describe(self) -> str:
        if self.how == "reconciler":
            return (
                f"settled by the reconciler on {self.outcome_worker or '?'} "
                f"(PENDING written by {self.pending_worker or '?'}, which did not finish it)"
            )
        if self.how == "executed again":
            return (
                f"executed again by {self.outcome_worker or '?'}: the call had no reconciler "
                f"then (PENDING written by {self.pending_worker or '?'})"
            )
        return f"finished by the run that journaled PENDING ({self.outcome_worker or '?'})"


def settlement(pending: CallEntry, outcome: CallEntry) -> Settlement:
    """Who settled a PENDING slot, from its PENDING value and the terminal one after it.

    A reconciling run journals the outcome with the PENDING value's ``started_ms`` (and
    its own worker id); a run re-executing a PENDING slot whose call no longer has a
    reconciler journals a new ``started_ms``; the run that wrote PENDING finishes with
    the same ``started_ms`` and worker id. A reconciler that ran in the very process
    that wrote PENDING (its partition given back to it, or a restart under a fixed
    ``--worker-id``) cannot be told from that run finishing: it reads as "own run".
    """
    how: Literal["reconciler", "own run", "executed again"] = "own run"
    if outcome.started_ms != pending.started_ms:
        how = "executed again"
    elif outcome.worker_id != pending.worker_id:
        how = "reconciler"
    return Settlement(how, pending.worker_id, outcome.worker_id)


@dataclass(frozen=True)
class SettledCall:
    """A PENDING call whose outcome the index read after it: the outcome and how."""

    call: CallEntry
    settled: Settlement


# What the index keeps of a live record: one bytes object, a 13-byte head (kind code,
# partition, offset) then the value's bytes, under its raw key in its record key's dict.
# Not the decoded entry (a decoded CallEntry costs several times its encoding: a page
# decodes only its key's few entries), nor a tuple of fields in a dict of all records
# beside a set per key and a map by call id: that took 526 bytes per record beyond the
# record's key and value, this 145 (bench/bench_console.py, a million records).
_HEAD = struct.Struct(">Biq")
KINDS = ("PENDING", "SUCCEEDED", "FAILED", "completed", "memory", "two-phase", "other",
         "unreadable")  # fmt: skip
_CODE = {kind: code for code, kind in enumerate(KINDS)}
_COMPLETED, _UNREADABLE = _CODE["completed"], _CODE["unreadable"]
RECENT = 100  # settled PENDING calls kept for /pending, newest last


def _kind(entry: JournalEntry) -> str:
    if isinstance(entry, CallEntry):
        return entry.status.value
    if isinstance(entry, ActionDone):
        return "completed"
    if isinstance(entry, MemorySnapshot):
        return "memory"
    if isinstance(entry, TwoPhaseCall):
        return "two-phase"
    return "other"


def _output_slot(topic: str, partition: int, seq: int, action: str) -> int:
    """Where the outputs of one action run are indexed: a hash of what both its
    ActionDone's raw key (with its partition) and its outputs' identities name, so a
    lookup parses the identity and a tombstone finds the slot without decoding."""
    return hash((topic, partition, seq, action))


class JournalIndex:
    """Live entries of one ActionState topic, by record key, plus the PENDING calls, the
    settled ones, and counts per kind, kept up to date as records arrive (nothing is
    scanned when a page is built). A call id or an output identity is parsed into the
    slot it names and checked against the stored entry: no per-call map. Thread-safe:
    the tailer applies, pages read."""

    def __init__(self, decode: Callable[[bytes, bytes], JournalEntry], origin: str) -> None:
        self._decode = decode
        self._origin = origin  # what outputs' identities start with (the app id)
        self._lock = threading.Lock()
        self._keys: dict[str, dict[bytes, bytes]] = {}  # record key -> raw key -> stored
        self._other: dict[bytes, bytes] = {}  # readable entries of no record key (markers)
        self._size = 0
        self._pending: dict[bytes, CallEntry] = {}
        self._open: dict[bytes, int] = {}  # open two-phase obligation -> its partition
        self._settled: dict[bytes, Settlement] = {}
        self._recent: deque[SettledCall] = deque(maxlen=RECENT)
        self._unreadable: dict[bytes, Unreadable] = {}
        self._outputs: dict[int, bytes] = {}  # _output_slot -> the ActionDone's raw key
        # completion group raw key -> (its offset, its members' (done key, record key))
        self._groups: dict[bytes, tuple[int, list[tuple[bytes, str]]]] = {}
        self._counts = [0] * len(KINDS)
        self.positions: dict[int, int] = {}  # next offset to read, per partition
        self.caught_up = False
        self.error: str | None = None  # why the tailer is not reading, if it is not

    # -- writes (the tailer) -------------------------------------------------------------
    def apply(self, raw_key: bytes, value: bytes | None, partition: int, offset: int) -> None:
        """Take one record of the topic (``value`` None: a tombstone)."""
        key = record_key(raw_key)
        with self._lock:
            self.positions[partition] = offset + 1
            prior = self._pending.get(raw_key)  # the PENDING value this one may settle
            self._forget(raw_key, key)
            if value is None:
                return
            try:
                entry = self._decode(raw_key, value)
                if isinstance(entry, CompletionGroup):
                    self._keep_group(raw_key, entry, partition, offset, value)
                    return
            except Exception as exc:  # shown as unreadable, never fatal
                shown = key if key is not None else raw_key.decode("utf-8", "replace")
                reason = f"{type(exc).__name__}: {exc}"
                self._unreadable[raw_key] = Unreadable(raw_key, shown, partition, offset, reason)
                self._keep(raw_key, shown, _UNREADABLE, partition, offset, value)
                return
            self._keep(raw_key, key, _CODE[_kind(entry)], partition, offset, value)
            if isinstance(entry, TwoPhaseCall):
                if entry.phase.open:  # a commit or an abort still owed
                    self._open[raw_key] = partition
                return
            if key is None or not isinstance(entry, CallEntry | ActionDone):
                return
            if isinstance(entry, ActionDone):
                if entry.outputs:
                    ref = entry.ref
                    slot = _output_slot(ref.topic, ref.partition, ref.seq, ref.action)
                    self._outputs[slot] = raw_key
            elif entry.status is CallStatus.PENDING:
                self._pending[raw_key] = entry
            elif prior is not None:
                settled = settlement(prior, entry)
                self._settled[raw_key] = settled
                self._recent.append(SettledCall(entry, settled))

    def _keep_group(
        self, raw_key: bytes, group: CompletionGroup, partition: int, offset: int, value: bytes
    ) -> None:
        """A completion group (v7): each ActionDone indexed under its own done key, with
        the group's value (decoded through :meth:`_read`), as a standalone one would be."""
        members = []
        for done in group.dones:
            member, ref = done_key(done.ref), done.ref
            self._forget(member, ref.key)
            self._keep(member, ref.key, _COMPLETED, partition, offset, value)
            members.append((member, ref.key))
            if done.outputs:
                self._outputs[_output_slot(ref.topic, ref.partition, ref.seq, ref.action)] = member
        self._groups[raw_key] = (offset, members)

    def _forget_group(self, raw_key: bytes) -> None:
        offset, members = self._groups.pop(raw_key, (0, []))
        for member, key in members:
            stored = self._keys.get(key, {}).get(member)
            if stored is not None and _HEAD.unpack_from(stored)[2] == offset:
                self._forget(member, key)  # not replaced since by a record of its own

    def _read(self, raw: bytes, value: bytes) -> JournalEntry:
        """The entry stored under ``raw``: a group member's ActionDone out of its group."""
        entry = self._decode(raw, value)
        if isinstance(entry, CompletionGroup):
            for done in entry.dones:
                if done_key(done.ref) == raw:
                    return done
        return entry

    def _keep(
        self, raw_key: bytes, key: str | None, code: int, partition: int, offset: int, value: bytes
    ) -> None:
        group = self._other if key is None else self._keys.setdefault(key, {})
        group[raw_key] = _HEAD.pack(code, partition, offset) + value
        self._counts[code] += 1
        self._size += 1

    def _forget(self, raw_key: bytes, key: str | None) -> None:
        if raw_key in self._groups:
            self._forget_group(raw_key)
        bad = self._unreadable.pop(raw_key, None)
        name = bad.key if bad is not None else key
        group = self._other if name is None else self._keys.get(name)
        old = None if group is None else group.pop(raw_key, None)
        if old is None:
            return
        code, partition, _ = _HEAD.unpack_from(old)
        self._counts[code] -= 1
        self._size -= 1
        if not group and name is not None:
            del self._keys[name]
        self._pending.pop(raw_key, None)
        self._settled.pop(raw_key, None)
        self._open.pop(raw_key, None)
        if code == _COMPLETED:
            fields = identity_fields(decode_identity(raw_key))
            try:
                slot = _output_slot(
                    fields["topic"], partition, int(fields["seq"]), fields["action"]
                )
            except (KeyError, ValueError):  # not a key a decodable ActionDone has
                return
            if self._outputs.get(slot) == raw_key:
                del self._outputs[slot]

    # -- reads (the pages) ---------------------------------------------------------------
    def entries_of(self, key: str) -> list[Located | Unreadable]:
        """``key``'s live entries, decoded (the unreadable ones as such)."""
        with self._lock:
            raws = [
                (raw, stored, self._unreadable.get(raw), self._settled.get(raw))
                for raw, stored in self._keys.get(key, {}).items()
            ]
        out: list[Located | Unreadable] = []
        for raw, stored, bad, settled in raws:
            if bad is not None:
                out.append(bad)
                continue
            _, partition, offset = _HEAD.unpack_from(stored)
            try:
                entry = self._read(raw, stored[_HEAD.size :])
            except Exception as exc:  # read once already: a codec that changed since
                reason = f"{type(exc).__name__}: {exc}"
                out.append(Unreadable(raw, key, partition, offset, reason))
                continue
            out.append(Located(entry, partition, offset, settled))
        return out

    def pending(self) -> list[CallEntry]:
        """PENDING calls, oldest first."""
        with self._lock:
            calls = list(self._pending.values())
        return sorted(calls, key=lambda c: (c.started_ms, c.ref.key, c.ref.seq, c.index))

    def settled(self) -> list[SettledCall]:
        """The last :data:`RECENT` PENDING calls this index read the outcome of, newest
        first (kept after their slots are pruned: a history, not live entries)."""
        with self._lock:
            return list(reversed(self._recent))

    def two_phase_waiting(self) -> dict[int, int]:
        """Open two-phase obligations (PREPARED or ABORTING: a commit or an abort still
        owed) per ActionState partition, the input partition whose owner settles them."""
        with self._lock:
            partitions = list(self._open.values())
        waiting: dict[int, int] = {}
        for partition in partitions:
            waiting[partition] = waiting.get(partition, 0) + 1
        return dict(sorted(waiting.items()))

    def unreadable(self) -> list[Unreadable]:
        with self._lock:
            return sorted(self._unreadable.values(), key=lambda u: (u.partition, u.offset))

    def find(self, query: str) -> str | None:
        """The record key that ``query`` names: a key, a call id, or an output identity
        (``x-agents-stream-output``, with or without its index)."""
        query = query.strip()
        with self._lock:
            if query in self._keys:
                return query
        return self._key_of_call(query) or self._key_of_output(query)

    def _key_of_call(self, call_id: str) -> str | None:
        """The key of the call slot ``call_id`` names (``app:topic:key:seq:action:index``,
        or ``app:key:seq:action:index`` before v5), if the index holds that call. App
        ids, topic names and action ids have no ``:``; a key may."""
        parts = call_id.rsplit(":", 3)
        if len(parts) != 4:
            return None
        head, seq, action, index = parts
        try:
            seq_n, index_n = int(seq), int(index)
        except ValueError:
            return None
        _, _, rest = head.partition(":")  # past the app id
        topic, _, key = rest.partition(":")
        refs = [ActionRef(rest, seq_n, action)]  # the legacy layout
        if key:
            refs.insert(0, ActionRef(key, seq_n, action, topic=topic))
        for ref in refs:
            found = self._stored_entry(ref.key, call_key(ref, index_n))
            if isinstance(found, CallEntry) and found.call_id == call_id:
                return ref.key
        return None

    def _key_of_output(self, identity: str) -> str | None:
        """The key of the action run whose outputs ``identity`` names
        (``app/topic/partition/seq/action/finished_ms[/index]``)."""
        parts = identity.split("/")
        if len(parts) == 6:
            parts.append("")
        if len(parts) != 7 or not (parts[6] == "" or parts[6].isdigit()):
            return None
        try:
            slot = _output_slot(parts[1], int(parts[2]), int(parts[3]), parts[4])
        except ValueError:
            return None
        with self._lock:
            raw = self._outputs.get(slot)
        key = None if raw is None else record_key(raw)
        if raw is None or key is None:
            return None
        done = self._stored_entry(key, raw)
        prefix = "/".join(parts[:6]) + "/"
        if isinstance(done, ActionDone) and output_prefix(self._origin, done) == prefix:
            return key
        return None

    def _stored_entry(self, key: str, raw: bytes) -> JournalEntry | None:
        with self._lock:
            stored = self._keys.get(key, {}).get(raw)
        if stored is None or raw in self._unreadable:
            return None
        try:
            return self._read(raw, stored[_HEAD.size :])
        except Exception:  # unreadable now: not what the query names
            return None

    def stats(self) -> dict[str, int]:
        """Live entries, keys, and entries per kind (PENDING, SUCCEEDED, FAILED,
        completed, memory, two-phase obligations, unreadable, other)."""
        with self._lock:
            counts = {kind: n for kind, n in zip(KINDS, self._counts, strict=True) if n}
            return {"entries": self._size, "keys": len(self._keys), **counts}


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
        said: str | None = None  # the error last logged: one line per change, not per retry

        def reading() -> None:
            nonlocal said
            if said is not None:
                log.info("reading %s again", self._topic)
                said = None

        while not self._stop.is_set():
            try:
                self._follow(reading)
            except Exception as exc:  # retried: the console stays up
                from confluent_kafka import KafkaException

                text = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
                self._index.error = text
                if text != said:
                    log.warning("cannot read %s: %s (retrying every 2 s)", self._topic, text)
                    said = text
                self._stop.wait(2.0)

    def _follow(self, reading: Callable[[], None] | None = None) -> None:
        """Read on until stopped; ``reading`` is called once the topic is assigned."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        from ..kafka.config import reader_config

        group = f"agents-stream-console-{uuid.uuid4().hex[:8]}"
        consumer = Consumer(reader_config(self._bootstrap, {"group.id": group, "log_level": 0}))
        try:
            meta = consumer.list_topics(self._topic, timeout=10).topics.get(self._topic)
            if meta is None or meta.error is not None or not meta.partitions:
                reason = meta.error.str() if meta is not None and meta.error else "no partitions"
                raise LookupError(f"topic {self._topic!r} cannot be read yet ({reason})")
            index = self._index
            starts = {p: index.positions.get(p, OFFSET_BEGINNING) for p in meta.partitions}
            consumer.assign([TopicPartition(self._topic, p, o) for p, o in starts.items()])
            index.error = None
            if reading is not None:
                reading()
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
