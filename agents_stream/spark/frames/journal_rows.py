"""Flat rows of decoded ActionState records: the executor side of the ActionState reader.

One journal record (a live value of the ActionState topic) becomes one row of
:data:`JOURNAL_COLUMNS`, whatever its kind (call slot, action completion, memory
snapshot, truncation, two-phase obligation) and whatever schema version wrote it
(v1..v3 decode to today's dataclasses through
:func:`~agents_stream.serde.journal.default_journal_codec`). Payloads (call results,
outputs) are shown as JSON text when they are UTF-8 JSON; other payloads (e.g. an app's
opt-in pickle codec) are *never* deserialized here, only sized.

A value that cannot be decoded is not fatal: it becomes a row of kind ``undecodable``
whose ``error`` names the slot (key, seq, action, call index), so an audit can count and
list it. This module imports nothing from PySpark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import pyarrow as pa

from ...durable.errors import JournalDecodeError
from ...durable.journal import (
    ActionDone,
    CallEntry,
    CompletionGroup,
    InputProgress,
    JournalEntry,
    MemorySnapshot,
    Truncation,
    TwoPhaseCall,
    expand,
)
from ...durable.values import MAGIC, VERSION
from ...serde.journal import JournalCodec, default_journal_codec

_ACTION_ORDINAL = re.compile(r"#\d+$")

# (name, Arrow type, Spark DDL type): the single definition both schemas derive from.
JOURNAL_TYPES: list[tuple[str, pa.DataType, str]] = [
    ("partition", pa.int32(), "INT"),
    ("offset", pa.int64(), "BIGINT"),
    ("timestamp_ms", pa.int64(), "BIGINT"),
    ("kind", pa.string(), "STRING"),
    ("key", pa.string(), "STRING"),
    ("seq", pa.int64(), "BIGINT"),
    ("action", pa.string(), "STRING"),
    ("action_name", pa.string(), "STRING"),
    ("index", pa.int32(), "INT"),
    ("function_id", pa.string(), "STRING"),
    ("args_digest", pa.string(), "STRING"),
    ("status", pa.string(), "STRING"),
    ("result_json", pa.string(), "STRING"),
    ("result_size", pa.int32(), "INT"),
    ("exception_type", pa.string(), "STRING"),
    ("exception_message", pa.string(), "STRING"),
    ("call_id", pa.string(), "STRING"),
    ("started_ms", pa.int64(), "BIGINT"),
    ("finished_ms", pa.int64(), "BIGINT"),
    ("attempts", pa.int32(), "INT"),
    ("worker_id", pa.string(), "STRING"),
    ("outputs_count", pa.int32(), "INT"),
    ("outputs_json", pa.list_(pa.string()), "ARRAY<STRING>"),
    ("emitted", pa.bool_(), "BOOLEAN"),
    ("calls", pa.int32(), "INT"),
    ("events", pa.int32(), "INT"),
    ("memory_updates", pa.int32(), "INT"),
    ("expected_function_id", pa.string(), "STRING"),
    ("recorded_function_id", pa.string(), "STRING"),
    ("expected_args_digest", pa.string(), "STRING"),
    ("recorded_args_digest", pa.string(), "STRING"),
    ("dropped", pa.int32(), "INT"),
    ("at_ms", pa.int64(), "BIGINT"),
    ("error", pa.string(), "STRING"),
    ("raw_value", pa.binary(), "BINARY"),
    # Input topic of the action run ("" for entries written before v5); for a
    # "progress" row (InputProgress marker) the topic whose partition it covers, with
    # the marker's exclusive completed-through offset in ``seq``.
    ("topic", pa.string(), "STRING"),
    # Of an ActionDone not marked emitted: the indexes of its outputs known to be in the
    # output topic (a send of them partly failed; v6).
    ("emitted_outputs", pa.list_(pa.int32()), "ARRAY<INT>"),
    # Of a "two_phase" row (a TwoPhaseCall obligation, v8): its phase (PREPARED,
    # COMMITTED, ABORTING, ABORTED), its round (a preparation made afresh after an abort
    # is round + 1) and the error of its last failed commit or abort. Its other fields
    # are those of a call row: ``result_json``/``result_size`` the prepared result,
    # ``started_ms`` when it was prepared, ``finished_ms`` when it was settled (0: not
    # yet), ``attempts`` of commit/abort, ``worker_id`` who wrote it last.
    ("phase", pa.string(), "STRING"),
    ("round", pa.int32(), "INT"),
    ("last_error", pa.string(), "STRING"),
]

JOURNAL_COLUMNS: list[str] = [name for name, _, _ in JOURNAL_TYPES]
"""Column names of a decoded journal row, in order."""

JOURNAL_ARROW_SCHEMA = pa.schema([pa.field(name, typ) for name, typ, _ in JOURNAL_TYPES])
"""Arrow schema of decoded journal rows (what :func:`decode_batches` yields)."""

JOURNAL_DDL = ", ".join(f"`{name}` {ddl}" for name, _, ddl in JOURNAL_TYPES)
"""Spark DDL schema of decoded journal rows."""

KINDS = ("call", "done", "memory", "truncation", "progress", "two_phase", "undecodable")
"""Kinds this reader names; entry kinds added later appear as their class name, lowercased."""


def action_name(action: str) -> str:
    """``Agent.method#3`` -> ``Agent.method`` (the ordinal only orders runs of a record)."""
    return _ACTION_ORDINAL.sub("", action)


TAGGED_HEADER = MAGIC + VERSION


def payload_json(data: bytes | None) -> str | None:
    """``data`` as JSON text if it is UTF-8 JSON, else ``None`` (never unpickled)."""
    if data is None:
        return None
    if data.__class__ is not bytes:
        data = bytes(data)
    if data[:2] == TAGGED_HEADER:  # the exact value encoding: its tagged JSON
        data = data[2:]
    try:
        text = data.decode("utf-8")
        _json_decode(text)
    except (UnicodeDecodeError, ValueError):
        return None
    return text


# json.loads without its argument checks (a str is all it is given here): per payload.
_json_decode = json.JSONDecoder().decode


def entry_row(entry: JournalEntry) -> dict[str, Any]:
    """The row fields describing ``entry`` (without Kafka coordinates)."""
    if isinstance(entry, CallEntry):
        exc = entry.exception
        return {
            "kind": "call",
            **_ref(entry.ref),
            "index": entry.index,
            "function_id": entry.function_id,
            "args_digest": entry.args_digest,
            "status": entry.status.value,
            "result_json": payload_json(entry.result),
            "result_size": None if entry.result is None else len(entry.result),
            "exception_type": exc.type if exc else None,
            "exception_message": exc.message if exc else None,
            "call_id": entry.call_id,
            "started_ms": entry.started_ms,
            "finished_ms": entry.finished_ms,
            "attempts": entry.attempts,
            "worker_id": entry.worker_id,
        }
    if isinstance(entry, ActionDone):
        return {
            "kind": "done",
            **_ref(entry.ref),
            "outputs_count": len(entry.outputs),
            "outputs_json": [payload_json(o) for o in entry.outputs],
            "emitted": entry.emitted,
            "emitted_outputs": list(entry.emitted_outputs),
            "calls": entry.calls,
            "events": len(entry.events),
            "memory_updates": len(entry.memory_updates),
            "finished_ms": entry.finished_ms,
        }
    if isinstance(entry, MemorySnapshot):
        return {"kind": "memory", "key": entry.key, "seq": entry.applied_seq}
    if isinstance(entry, Truncation):
        return {
            "kind": "truncation",
            **_ref(entry.ref),
            "index": entry.index,
            "expected_function_id": entry.expected_function_id,
            "recorded_function_id": entry.recorded_function_id,
            "expected_args_digest": entry.expected_args_digest,
            "recorded_args_digest": entry.recorded_args_digest,
            "dropped": entry.dropped,
            "at_ms": entry.at_ms,
        }
    if isinstance(entry, TwoPhaseCall):
        prepared = entry.prepared
        return {
            "kind": "two_phase",
            **_ref(entry.ref),
            "index": entry.index,
            "function_id": entry.function_id,
            "args_digest": entry.args_digest,
            "phase": entry.phase.value,
            "result_json": payload_json(prepared),
            "result_size": None if prepared is None else len(prepared),
            "call_id": entry.call_id,
            "round": entry.round,
            "started_ms": entry.prepared_ms,
            "finished_ms": entry.settled_ms,
            "attempts": entry.attempts,
            "last_error": entry.last_error or None,
            "worker_id": entry.worker_id,
        }
    if isinstance(entry, InputProgress):
        return {
            "kind": "progress",
            "topic": entry.topic,
            "seq": entry.offset,
            "at_ms": entry.at_ms,
            "worker_id": entry.worker_id,
        }
    # An entry kind newer than this reader (e.g. timers): kept as a row of its own kind.
    row: dict[str, Any] = {"kind": type(entry).__name__.lower()}
    ref, key = getattr(entry, "ref", None), getattr(entry, "key", None)
    if ref is not None:
        row.update(_ref(ref))
    elif isinstance(key, str):
        row["key"] = key
    return row


def _ref(ref: Any) -> dict[str, Any]:
    return {
        "key": ref.key,
        "topic": ref.topic,
        "seq": ref.seq,
        "action": ref.action,
        "action_name": action_name(ref.action),
    }


def decode_record(
    codec: JournalCodec, key: bytes, value: bytes, *, include_raw: bool = False
) -> dict[str, Any]:
    """One row for a live record; an undecodable value yields kind ``undecodable``."""
    try:
        entry = codec.decode(key, value)
        # A completion group (v7) is rows of its ActionDones (journal_batch): its first.
        row = entry_row(expand(entry)[0] if isinstance(entry, CompletionGroup) else entry)
    except JournalDecodeError as exc:
        row = {"kind": "undecodable", "error": str(exc), **_key_fields(exc)}
    if include_raw:
        row["raw_value"] = value
    return row


def _key_fields(exc: JournalDecodeError) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("key", "seq", "action", "index"):
        value = getattr(exc, name, None)
        if value is not None:
            out[name] = value
    if "action" in out:
        out["action_name"] = action_name(out["action"])
    return out


@lru_cache(maxsize=8)
def reader_codec(registry_url: str | None, topic: str | None) -> JournalCodec:
    """The journal codec of a Spark worker process, built once per registry and topic:
    building one compiles its decoders (~15-45 ms), and a reused Python worker runs many
    tasks. Decoding leaves a codec unchanged."""
    return default_journal_codec(registry_url, topic)


def decode_batches(
    batches: Iterable[pa.RecordBatch],
    *,
    registry_url: str | None = None,
    topic: str | None = None,
    include_raw: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Decodes batches of live ActionState records into journal-row batches.

    Input batches need ``key``, ``value`` (not null), ``partition``, ``offset`` and
    ``timestamp_ms`` columns. The codec is built once per worker process.
    """
    codec = reader_codec(registry_url, topic)
    for batch in batches:
        cols = batch.to_pydict()
        yield journal_batch(
            codec,
            cols["key"],
            cols["value"],
            cols["partition"],
            cols["offset"],
            cols["timestamp_ms"],
            include_raw=include_raw,
        )


_RAW = JOURNAL_COLUMNS.index("raw_value")
_NONE_ROW = (None,) * (len(JOURNAL_COLUMNS) - 3)


def journal_batch(
    codec: JournalCodec,
    keys: Sequence[bytes | None],
    values: Sequence[bytes],
    partitions: Sequence[int],
    offsets: Sequence[int],
    timestamps: Sequence[int],
    *,
    include_raw: bool = False,
) -> pa.RecordBatch:
    """One journal-row batch (:data:`JOURNAL_ARROW_SCHEMA`) of live records, column-wise.

    Each record is decoded once and becomes one tuple in column order (calls and
    completions without an intermediate dict); the tuples are transposed in C and each
    column goes to Arrow in one call. Rows equal :func:`decode_record`'s.
    """
    rows = []
    raws: list[bytes] = []
    for key, value, partition, offset, ts in zip(
        keys, values, partitions, offsets, timestamps, strict=True
    ):
        row = _values(codec, key, value)  # type: ignore[arg-type]
        if row.__class__ is list:  # a completion group: one row per ActionDone
            for member in row:
                rows.append((partition, offset, ts, *member))
                raws.append(value)
        else:
            rows.append((partition, offset, ts, *row))
            raws.append(value)
    columns: list[Sequence[Any]] = (
        list(zip(*rows, strict=True)) if rows else [()] * len(JOURNAL_COLUMNS)
    )
    if include_raw:
        columns[_RAW] = raws
    return pa.RecordBatch.from_arrays(
        [
            pa.array(col, field.type)
            for col, field in zip(columns, JOURNAL_ARROW_SCHEMA, strict=True)
        ],
        schema=JOURNAL_ARROW_SCHEMA,
    )


def _values(
    codec: JournalCodec, key: bytes, value: bytes
) -> tuple[Any, ...] | list[tuple[Any, ...]]:
    """A record's row in column order, after the coordinates (partition, offset, ts); a
    completion group's (v7) rows, one per ActionDone, as a list."""
    try:
        entry = codec.decode(key, value)
    except JournalDecodeError as exc:
        return _row_values({"kind": "undecodable", "error": str(exc), **_key_fields(exc)})
    cls = entry.__class__
    if cls is CallEntry:
        return _call_values(entry)  # type: ignore[arg-type]
    if cls is ActionDone:
        return _done_values(entry)  # type: ignore[arg-type]
    if cls is CompletionGroup:
        return [_done_values(done) for done in entry.dones]  # type: ignore[union-attr]
    return _row_values(entry_row(entry))


# -- the checks view: what the audit's input and output checks read of each record --------
CHECK_COLUMNS: list[str] = [
    "partition", "kind", "topic", "key", "seq", "action", "action_name", "status", "outputs_json",
]  # fmt: skip
"""The journal columns the audit's input and output checks use (``missing_inputs``,
``duplicate_outputs``): its ``journal.view=checks`` rows have only these."""
_CHECK_TYPES = {name: (typ, ddl) for name, typ, ddl in JOURNAL_TYPES}
CHECK_ARROW_SCHEMA = pa.schema([pa.field(n, _CHECK_TYPES[n][0]) for n in CHECK_COLUMNS])
CHECK_DDL = ", ".join(f"`{n}` {_CHECK_TYPES[n][1]}" for n in CHECK_COLUMNS)
# Where each check column sits in _values() (which starts after partition, offset, ts).
_CHECK_AT = [JOURNAL_COLUMNS.index(n) - 3 for n in CHECK_COLUMNS[1:]]
_CALL_FIELDS = ("topic", "key", "seq", "action", "status", "exception")
_DONE_FIELDS = ("topic", "key", "seq", "action", "outputs")

Skims = dict[bytes, tuple[bool, Any]]


def skims(codec: JournalCodec, call_fields: tuple[str, ...], done_fields: tuple[str, ...]) -> Skims:
    """Record head -> (is a call, projection) for the calls and completions that
    ``codec``'s own schema wrote, reading those fields (other records: decode them)."""
    found: Skims = {}
    for kind, fields in ((CallEntry, call_fields), (ActionDone, done_fields)):
        projection = codec.projection(kind, fields)
        if projection is not None:
            found[projection[0]] = (kind is CallEntry, projection[1])
    return found


def skim(found: Skims, value: bytes) -> tuple[bool, tuple[Any, ...]] | None:
    """(is a call, its projected fields) of ``value``, or None: not one of ``found``'s
    kinds, or a body that does not decode (the full decode says why)."""
    hit = found.get(value[:11])
    if hit is None:
        return None
    try:
        fields, end = hit[1](value, 11)
    except Exception:
        return None
    return (hit[0], fields) if end == len(value) else None


def call_status(status: str | None, exception: Any) -> str:
    """A call's status as the codec builds it: a writer before v2 left it null, and the
    exception tells it then."""
    if status is not None:
        return status
    return "FAILED" if exception is not None else "SUCCEEDED"


def check_batches(
    codec: JournalCodec, records: Sequence[Any], partition: int, *, batch_size: int = 10_000
) -> Iterator[pa.RecordBatch]:
    """Check-view batches (:data:`CHECK_ARROW_SCHEMA`) of the live confluent-kafka messages
    of one partition: the journal rows' :data:`CHECK_COLUMNS`, equal to theirs.

    Calls and completions written by the codec's own schema are read through projections
    (their ActionState, status, outputs) instead of decoded whole."""
    found = skims(codec, _CALL_FIELDS, _DONE_FIELDS)
    for start in range(0, len(records), batch_size):
        rows: list[tuple[Any, ...]] = []
        for m in records[start : start + batch_size]:
            value = m.value()
            hit = skim(found, value) if found else None
            if hit is None:
                full = _values(codec, m.key(), value)
                for one in full if full.__class__ is list else [full]:
                    rows.append((partition, *[one[i] for i in _CHECK_AT]))
                continue
            is_call, (topic, key, seq, action, *rest) = hit
            name = _action_name(action)
            if is_call:
                status = call_status(rest[0], rest[1])
                rows.append((partition, "call", topic, key, seq, action, name, status, None))
            else:
                outputs = [payload_json(o) for o in rest[0]]
                rows.append((partition, "done", topic, key, seq, action, name, None, outputs))
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(CHECK_COLUMNS)
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, CHECK_ARROW_SCHEMA, strict=True)],
            schema=CHECK_ARROW_SCHEMA,
        )


def _row_values(row: dict[str, Any]) -> tuple[Any, ...]:
    # Everything but partition, offset, timestamp_ms (the record's, not the entry's).
    get = row.get
    return tuple(get(name) for name in JOURNAL_COLUMNS[3:])


@lru_cache(maxsize=4096)
def _action_name(action: str) -> str:
    # A handful of distinct action ids repeat over every record of a topic.
    return action_name(action)


def _call_values(e: CallEntry) -> tuple[Any, ...]:
    """:func:`entry_row` of a call, as a tuple in column order (after the coordinates)."""
    ref, exc, result = e.ref, e.exception, e.result
    return (
        "call",
        ref.key,
        ref.seq,
        ref.action,
        _action_name(ref.action),
        e.index,
        e.function_id,
        e.args_digest,
        e.status.value,
        payload_json(result),
        None if result is None else len(result),
        exc.type if exc else None,
        exc.message if exc else None,
        e.call_id,
        e.started_ms,
        e.finished_ms,
        e.attempts,
        e.worker_id,
        None,  # outputs_count
        None,  # outputs_json
        None,  # emitted
        None,  # calls
        None,  # events
        None,  # memory_updates
        None,  # expected_function_id
        None,  # recorded_function_id
        None,  # expected_args_digest
        None,  # recorded_args_digest
        None,  # dropped
        None,  # at_ms
        None,  # error
        None,  # raw_value
        ref.topic,
        None,  # emitted_outputs
        None,  # phase
        None,  # round
        None,  # last_error
    )


def _done_values(e: ActionDone) -> tuple[Any, ...]:
    """:func:`entry_row` of a completion, as a tuple in column order."""
    ref = e.ref
    return (
        "done",
        ref.key,
        ref.seq,
        ref.action,
        _action_name(ref.action),
        None,  # index
        None,  # function_id
        None,  # args_digest
        None,  # status
        None,  # result_json
        None,  # result_size
        None,  # exception_type
        None,  # exception_message
        None,  # call_id
        None,  # started_ms
        e.finished_ms,
        None,  # attempts
        None,  # worker_id
        len(e.outputs),
        [payload_json(o) for o in e.outputs],
        e.emitted,
        e.calls,
        len(e.events),
        len(e.memory_updates),
        None,  # expected_function_id
        None,  # recorded_function_id
        None,  # expected_args_digest
        None,  # recorded_args_digest
        None,  # dropped
        None,  # at_ms
        None,  # error
        None,  # raw_value
        ref.topic,
        list(e.emitted_outputs),
        None,  # phase
        None,  # round
        None,  # last_error
    )


def live_records(messages: Iterable[Iterable[Any]]) -> list[Any]:
    """What compaction leaves of one Kafka partition read in offset order: the last
    record of each key, keys whose last record is a tombstone dropped (as
    :func:`~agents_stream.spark.frames.action_state.compact`, without a shuffle).

    ``messages``: lists of confluent-kafka messages, in offset order.
    """
    live: dict[bytes | None, Any] = {}
    pop = live.pop
    for batch in messages:
        for m in batch:
            key = m.key()
            if m.value() is None:
                pop(key, None)
            else:
                live[key] = m
    return list(live.values())


def journal_batches_of(
    codec: JournalCodec,
    records: Sequence[Any],
    partition: int,
    *,
    include_raw: bool = False,
    batch_size: int = 10_000,
) -> Iterator[pa.RecordBatch]:
    """Journal-row batches of live confluent-kafka messages of one partition."""
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        yield journal_batch(
            codec,
            [m.key() for m in chunk],
            [m.value() for m in chunk],
            [partition] * len(chunk),
            [m.offset() for m in chunk],
            [m.timestamp()[1] for m in chunk],
            include_raw=include_raw,
        )


def decode_entries(
    codec: JournalCodec, records: Iterable[tuple[bytes, bytes]]
) -> list[JournalEntry]:
    """Decodes ``(key, value)`` pairs to journal entries (strict: errors propagate); a
    completion group (v7) to its ActionDones."""
    return [e for key, value in records for e in expand(codec.decode(key, value))]
