"""The audit's one-pass view of a journal: per-partition partial results, merged on the driver.

``spark audit`` needs a handful of small tables and counts from the whole ActionState
topic, never its rows (of the finished calls and completions, which are most records,
only their ActionState and status: read through projections of the journal codec, not
decoded whole). Every ActionState's records live in one Kafka partition (they are
keyed by their input record's partition), so the reader that compacts and decodes a
partition (``agents_stream.journal`` with ``journal.view=audit``) can also finish the
per-ActionState work there and yield only what the audit shows:

- ``status``: calls per ``(action_name, status)``, counted;
- ``state``: each ActionState *without* an ActionDone, with its call counts (completed
  ones are only counted);
- ``pending``: each PENDING call (the driver keeps the stuck ones: its ``now`` decides);
- ``obligation``: each open two-phase obligation (v8: PREPARED or ABORTING, a commit or
  an abort still owed; the driver keeps those prepared before the stuck threshold);
- ``failure``: FAILED calls per exception type: count, function ids, an example;
- ``truncation`` and ``undecodable``: their records;
- ``totals``: live records, ActionStates, completed ones and memory snapshots;
- ``overflow``: instead of all the above but ``totals``, when a partition has more rows
  than the reader was allowed to yield (``journal.viewRowLimit``).

:func:`merge_audit` turns the view's rows, collected on the driver, into the audit's
tables and figures, equal to what :func:`~agents_stream.spark.jobs.audit.journal_tables`
computes in Spark from the decoded journal (a test holds both to it). This module
imports nothing from PySpark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ...durable.errors import JournalDecodeError
from ...durable.journal import (
    ActionDone,
    CallEntry,
    CompletionGroup,
    MemorySnapshot,
    Truncation,
    TwoPhaseCall,
)
from ...serde.journal import JournalCodec
from .journal_rows import JOURNAL_TYPES, _action_name, _key_fields, call_status, skim, skims

# The view's columns: those of journal rows keep their type there; the rest are counts.
_COUNTS = ("pending_calls", "failed_calls", "succeeded_calls", "calls", "count", "states",
           "completed", "memory")  # fmt: skip
_OWN_TYPES: dict[str, tuple[pa.DataType, str]] = {
    "part": (pa.string(), "STRING"),
    "functions": (pa.list_(pa.string()), "ARRAY<STRING>"),
    "prepared_ms": (pa.int64(), "BIGINT"),
    **{name: (pa.int64(), "BIGINT") for name in _COUNTS},
}
_JOURNAL_TYPES = {name: (typ, ddl) for name, typ, ddl in JOURNAL_TYPES}
_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    (name, *(_OWN_TYPES.get(name) or _JOURNAL_TYPES[name]))
    for name in (
        "part", "partition", "offset", "topic", "key", "seq", "action", "action_name",
        "index", "status", "function_id", "call_id", "started_ms", "attempts", "worker_id",
        "pending_calls", "failed_calls", "succeeded_calls", "calls", "exception_type",
        "exception_message", "functions", "expected_function_id", "recorded_function_id",
        "expected_args_digest", "recorded_args_digest", "dropped", "at_ms", "error",
        # ``obligation``: an open two-phase call's phase, round, when it was prepared
        "phase", "round", "prepared_ms", "last_error",
        # ``status``/``failure``: calls counted; ``totals``: live records, ActionStates...
        "count", "states", "completed", "memory",
    )
]  # fmt: skip

AUDIT_COLUMNS: list[str] = [name for name, _, _ in _COLUMNS]
AUDIT_ARROW_SCHEMA = pa.schema([pa.field(name, typ) for name, typ, _ in _COLUMNS])
AUDIT_DDL = ", ".join(f"`{name}` {ddl}" for name, _, ddl in _COLUMNS)

_INDEX = {name: i for i, name in enumerate(AUDIT_COLUMNS)}
_WIDTH = len(AUDIT_COLUMNS)


def _row(part: str, **fields: Any) -> list[Any]:
    row: list[Any] = [None] * _WIDTH
    row[0] = part
    for name, value in fields.items():
        row[_INDEX[name]] = value
    return row


_PENDING_FIELDS = ("index", "function_id", "call_id", "started_ms", "attempts", "worker_id")
_OBLIGATION_FIELDS = ("index", "function_id", "call_id", "round", "attempts", "worker_id")
_TRUNCATION_FIELDS = ("index", "expected_function_id", "recorded_function_id",
                      "expected_args_digest", "recorded_args_digest", "dropped", "at_ms")  # fmt: skip


def _entry_row(part: str, partition: int, entry: Any, fields: tuple[str, ...]) -> list[Any]:
    ref = entry.ref
    row = _row(part, partition=partition, topic=ref.topic, key=ref.key, seq=ref.seq,
               action=ref.action)  # fmt: skip
    for name in fields:
        row[_INDEX[name]] = getattr(entry, name)
    return row


# The fields of the records the audit counts without decoding them whole: their
# ActionState first (as the ``states`` keys), then a call's status and exception.
_CALL_SKIM = ("topic", "key", "seq", "action", "status", "exception")
_DONE_SKIM = ("topic", "key", "seq", "action")


def audit_batch(
    codec: JournalCodec, records: Iterable[Any], partition: int, *, row_limit: int | None = None
) -> pa.RecordBatch:
    """The view's rows for the live records (confluent-kafka messages) of one partition.

    With more than ``row_limit`` rows, only an ``overflow`` row (with the partition's
    ``count`` of rows) is yielded: the caller computes the audit another way rather than
    collect them.
    """
    decode = codec.decode
    # ActionState (topic, key, seq, action) -> [pending, failed, succeeded, calls, done]
    states: dict[tuple[str, str, int, str], list[int]] = {}
    status: dict[tuple[str, str], int] = {}
    failures: dict[str | None, list[Any]] = {}
    rows: list[list[Any]] = []
    live = memory = 0
    found = skims(codec, _CALL_SKIM, _DONE_SKIM)
    for m in records:
        live += 1
        value = m.value()
        hit = skim(found, value) if found else None
        if hit is not None:
            # Most records are a finished call or a completion: what the audit counts of
            # them is in a few fields, read without building the entry (~2x faster). A
            # body that does not decode, a PENDING or FAILED call go the full way.
            is_call, fields = hit
            ident = fields[:4]
            if not is_call:
                states.setdefault(ident, [0, 0, 0, 0, 0])[4] = 1
                continue
            name = call_status(fields[4], fields[5])
            if name == "SUCCEEDED":
                counts = states.get(ident)
                if counts is None:
                    counts = states[ident] = [0, 0, 0, 0, 0]
                counts[3] += 1
                counts[2] += 1
                pair = (_action_name(fields[3]), name)
                status[pair] = status.get(pair, 0) + 1
                continue
        try:
            entry = decode(m.key(), value)
        except JournalDecodeError as exc:
            key_fields = _key_fields(exc)
            rows.append(
                _row(
                    "undecodable",
                    partition=partition,
                    offset=m.offset(),
                    key=key_fields.get("key"),
                    seq=key_fields.get("seq"),
                    action=key_fields.get("action"),
                    index=key_fields.get("index"),
                    error=str(exc),
                )
            )
            continue
        if type(entry) is CompletionGroup:  # v7: each of its ActionDones completed
            for member in entry.dones:
                ref = member.ref
                states.setdefault((ref.topic, ref.key, ref.seq, ref.action), [0, 0, 0, 0, 0])[4] = 1
            continue
        if type(entry) is CallEntry:
            ref = entry.ref
            ident = (ref.topic, ref.key, ref.seq, ref.action)
            counts = states.get(ident)
            if counts is None:
                counts = states[ident] = [0, 0, 0, 0, 0]
            counts[3] += 1
            name = entry.status.value
            pair = (_action_name(ref.action), name)
            status[pair] = status.get(pair, 0) + 1
            if name == "SUCCEEDED":
                counts[2] += 1
            elif name == "PENDING":
                counts[0] += 1
                rows.append(_entry_row("pending", partition, entry, _PENDING_FIELDS))
            elif name == "FAILED":
                counts[1] += 1
                exc_info = entry.exception
                exc_type = exc_info.type if exc_info else None
                failure = failures.get(exc_type)
                if failure is None:
                    message = exc_info.message if exc_info else None
                    failure = failures[exc_type] = [0, set(), message, entry.call_id]
                failure[0] += 1
                if entry.function_id is not None:
                    failure[1].add(entry.function_id)
        elif type(entry) is ActionDone:
            ref = entry.ref
            states.setdefault((ref.topic, ref.key, ref.seq, ref.action), [0, 0, 0, 0, 0])[4] = 1
        elif type(entry) is Truncation:
            ref = entry.ref
            states.setdefault((ref.topic, ref.key, ref.seq, ref.action), [0, 0, 0, 0, 0])
            rows.append(_entry_row("truncation", partition, entry, _TRUNCATION_FIELDS))
        elif type(entry) is MemorySnapshot:
            memory += 1
        elif type(entry) is TwoPhaseCall and entry.phase.open:
            row = _entry_row("obligation", partition, entry, _OBLIGATION_FIELDS)
            row[_INDEX["offset"]] = m.offset()
            row[_INDEX["phase"]] = entry.phase.value
            row[_INDEX["prepared_ms"]] = entry.prepared_ms
            row[_INDEX["last_error"]] = entry.last_error or None
            rows.append(row)
    completed = 0
    for (topic, key, seq, action), (pending, failed, ok, calls, done) in states.items():
        if done:
            completed += 1
            continue
        rows.append(
            _row(
                "state",
                partition=partition,
                topic=topic,
                key=key,
                seq=seq,
                action=action,
                pending_calls=pending,
                failed_calls=failed,
                succeeded_calls=ok,
                calls=calls,
            )
        )
    for (name, state), n in status.items():
        rows.append(_row("status", partition=partition, action_name=name, status=state, count=n))
    for exc_type, (n, functions, message, call_id) in failures.items():
        rows.append(
            _row(
                "failure",
                partition=partition,
                exception_type=exc_type,
                count=n,
                functions=sorted(functions),
                exception_message=message,
                call_id=call_id,
            )
        )
    if row_limit is not None and len(rows) > row_limit:
        rows = [_row("overflow", partition=partition, count=len(rows))]
    rows.append(
        _row(
            "totals",
            partition=partition,
            count=live,
            states=len(states),
            completed=completed,
            memory=memory,
        )
    )
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(col, f.type) for col, f in zip(columns, AUDIT_ARROW_SCHEMA, strict=True)],
        schema=AUDIT_ARROW_SCHEMA,
    )


# The audit tables' columns, typed as in the view: what the Spark path's tables hold.
_TABLE_COLUMNS = {
    "status_counts": ("action_name", "status", "count"),
    "in_flight": ("partition", "key", "seq", "action", "pending_calls", "failed_calls",
                  "succeeded_calls", "calls"),
    "stuck": ("partition", "key", "seq", "action", "index", "call_id", "function_id",
              "started_ms", "age_s", "attempts", "worker_id"),
    "failures": ("exception_type", "calls", "functions", "example_message", "example_call_id"),
    "stuck_two_phase": ("partition", "offset", "topic", "key", "seq", "action", "index",
                        "phase", "function_id", "call_id", "prepared_ms", "age_s", "round",
                        "attempts", "last_error", "worker_id"),
    "truncations": ("partition", "key", "seq", "action", "index", "expected_function_id",
                    "recorded_function_id", "expected_args_digest", "recorded_args_digest",
                    "dropped", "at_ms"),
    "undecodable": ("partition", "offset", "key", "seq", "action", "index", "error"),
}  # fmt: skip
_TYPES = {
    **{name: typ for name, typ, _ in _COLUMNS},
    "age_s": pa.float64(),
    "example_message": pa.string(),
    "example_call_id": pa.string(),
}
TABLE_SCHEMAS: dict[str, pa.Schema] = {
    table: pa.schema([(name, _TYPES[name]) for name in columns])
    for table, columns in _TABLE_COLUMNS.items()
}


def _table(name: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    schema = TABLE_SCHEMAS[name]
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema)


def _nulls_first(value: Any) -> tuple[bool, Any]:
    # Spark's ascending order puts nulls first.
    return (value is not None, value)


def merge_audit(
    view: pa.Table, *, now_ms: int, stuck_after_ms: int
) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """The audit's journal tables and figures from the view's rows of every partition.

    Returns:
        ``(tables, figures)``: the tables of ``journal_tables`` (same names, columns and
        row order where it has one) and the counts of the audit summary that the journal
        alone gives (``journal_records``, ``action_states``, ``calls_pending``...).
    """
    by_part: dict[str, list[dict[str, Any]]] = {}
    for row in view.to_pylist():
        by_part.setdefault(row["part"], []).append(row)
    if "overflow" in by_part:
        raise ValueError("the view holds overflow rows: a partition's rows were left out")
    status: dict[tuple[str, str], int] = {}
    for r in by_part.get("status", ()):
        pair = (r["action_name"], r["status"])
        status[pair] = status.get(pair, 0) + r["count"]
    failures: dict[str | None, list[Any]] = {}
    for r in by_part.get("failure", ()):
        merged = failures.get(r["exception_type"])
        if merged is None:
            failures[r["exception_type"]] = [r["count"], set(r["functions"]), r]
        else:
            merged[0] += r["count"]
            merged[1].update(r["functions"])
    threshold = now_ms - stuck_after_ms
    stuck = [
        {**r, "age_s": (now_ms - r["started_ms"]) / 1000}
        for r in by_part.get("pending", ())
        if r["started_ms"] is not None and r["started_ms"] < threshold
    ]
    stuck.sort(key=lambda r: r["started_ms"])
    obligations = by_part.get("obligation", ())
    stuck_two_phase = [
        {**r, "age_s": (now_ms - r["prepared_ms"]) / 1000}
        for r in obligations
        if r["prepared_ms"] is not None and r["prepared_ms"] < threshold
    ]
    stuck_two_phase.sort(key=lambda r: r["prepared_ms"])
    in_flight = sorted(
        by_part.get("state", ()),
        key=lambda r: (
            r["partition"],
            _nulls_first(r["seq"]),
            _nulls_first(r["action"]),
            _nulls_first(r["key"]),
            _nulls_first(r["topic"]),
        ),
    )
    failure_rows = [
        {
            "exception_type": exc_type,
            "calls": n,
            "functions": sorted(functions),
            "example_message": example["exception_message"],
            "example_call_id": example["call_id"],
        }
        for exc_type, (n, functions, example) in failures.items()
    ]
    failure_rows.sort(key=lambda r: -r["calls"])
    tables = {
        "status_counts": _table(
            "status_counts",
            [
                {"action_name": name, "status": s, "count": n}
                for (name, s), n in sorted(
                    status.items(), key=lambda kv: tuple(map(_nulls_first, kv[0]))
                )
            ],
        ),
        "in_flight": _table("in_flight", in_flight),
        "stuck": _table("stuck", stuck),
        "stuck_two_phase": _table("stuck_two_phase", stuck_two_phase),
        "failures": _table("failures", failure_rows),
        "truncations": _table("truncations", by_part.get("truncation", [])),
        "undecodable": _table("undecodable", by_part.get("undecodable", [])),
    }
    totals = by_part.get("totals", ())
    calls_by_status: dict[str, int] = {}
    for (_, s), n in status.items():
        calls_by_status[s] = calls_by_status.get(s, 0) + n
    figures = {
        "journal_records": sum(r["count"] for r in totals),
        "action_states": sum(r["states"] for r in totals),
        "completed_action_states": sum(r["completed"] for r in totals),
        "in_flight_action_states": len(in_flight),
        "calls_succeeded": calls_by_status.get("SUCCEEDED", 0),
        "calls_failed": calls_by_status.get("FAILED", 0),
        "calls_pending": calls_by_status.get("PENDING", 0),
        "stuck_calls": len(stuck),
        "two_phase_waiting": len(obligations),
        "stuck_two_phase_calls": len(stuck_two_phase),
        "truncations": len(by_part.get("truncation", ())),
        "undecodable_records": len(by_part.get("undecodable", ())),
        "memory_snapshots": sum(r["memory"] for r in totals),
    }
    return tables, figures
