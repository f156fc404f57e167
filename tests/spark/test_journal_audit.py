"""The audit's one-pass view (no Spark): per-partition partials merged on the driver give
the tables and figures a plain model computes from the decoded journal rows, whatever
the mix of calls, completions, truncations, snapshots, progress markers and garbage."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    InputProgress,
    MemorySnapshot,
    Truncation,
    TwoPhase,
    TwoPhaseCall,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark.frames.journal_audit import (
    AUDIT_ARROW_SCHEMA,
    audit_batch,
    merge_audit,
)
from agents_stream.spark.frames.journal_rows import (
    CHECK_ARROW_SCHEMA,
    CHECK_COLUMNS,
    check_batches,
    decode_record,
    journal_batch,
)

NOW, STUCK_AFTER = 10_000_000, 60_000
CODEC = default_journal_codec()


@dataclass
class Msg:
    """What the reader hands on of a confluent-kafka message."""

    k: bytes
    v: bytes
    o: int

    def key(self) -> bytes:
        return self.k

    def value(self) -> bytes:
        return self.v

    def offset(self) -> int:
        return self.o


refs = st.builds(
    ActionRef,
    key=st.sampled_from(["a", "b", "c"]),
    seq=st.integers(0, 4),
    action=st.sampled_from(["Pay.run#0", "Pay.run#1", "Mail.send#0"]),
    partition=st.just(0),  # set per partition below
    topic=st.sampled_from(["", "orders"]),
)
exceptions = st.none() | st.builds(
    ExceptionInfo,
    type=st.sampled_from(["builtins.ValueError", "builtins.TimeoutError"]),
    message=st.sampled_from(["x", "y"]),
)
calls = st.builds(
    CallEntry,
    ref=refs,
    index=st.integers(0, 2),
    function_id=st.sampled_from(["f.charge", "f.mail"]),
    args_digest=st.just("ab" * 8),
    status=st.sampled_from(list(CallStatus)),
    exception=exceptions,
    call_id=st.text("xyz", min_size=1, max_size=3),
    # the stuck threshold itself is not stuck (strictly older than it is)
    started_ms=st.integers(NOW - 2 * STUCK_AFTER, NOW) | st.just(NOW - STUCK_AFTER),
    worker_id=st.sampled_from(["w1", "w2"]),
)
dones = st.builds(ActionDone, ref=refs, outputs=st.just((b'{"ok":1}',)), calls=st.integers(0, 3))
truncations = st.builds(
    Truncation,
    ref=refs,
    index=st.integers(0, 2),
    expected_function_id=st.just("f.new"),
    expected_args_digest=st.just("cd" * 8),
    recorded_function_id=st.just("f.old"),
    recorded_args_digest=st.just("ab" * 8),
    dropped=st.integers(1, 3),
    at_ms=st.integers(0, NOW),
)
obligations = st.builds(
    TwoPhaseCall,
    ref=refs,
    index=st.integers(0, 2),
    function_id=st.just("f.charge"),
    args_digest=st.just("ab" * 8),
    phase=st.sampled_from(list(TwoPhase)),
    target=st.just(b"\x01\x01{}"),
    prepared=st.just(b'{"hold":"h"}'),
    call_id=st.text("xyz", min_size=1, max_size=3),
    round=st.integers(0, 2),
    prepared_ms=st.integers(NOW - 2 * STUCK_AFTER, NOW) | st.just(NOW - STUCK_AFTER),
    attempts=st.integers(0, 3),
    last_error=st.sampled_from(["", "psp.Down: 503"]),
)
snapshots = st.builds(
    MemorySnapshot, key=st.sampled_from(["a", "b"]), applied_seq=st.integers(0, 4)
)
progress = st.builds(
    InputProgress, topic=st.just("orders"), partition=st.just(0), offset=st.integers(0, 9)
)
# A call or completion whose body was cut short: undecodable behind a valid head, where
# the audit reads a few fields without decoding the rest.
cut = st.tuples(st.just("cut"), calls | dones, st.integers(1, 40))
entries = st.one_of(
    calls, dones, truncations, snapshots, progress, obligations, st.just("garbage"), cut
)


def _with_partition(entry: Any, partition: int) -> Any:
    from dataclasses import replace

    if hasattr(entry, "ref"):
        return replace(entry, ref=replace(entry.ref, partition=partition))
    return replace(entry, partition=partition)


def _live(entries: list[Any], partition: int) -> list[Msg]:
    """The partition's live records: the last value per key, as compaction leaves it."""
    live: dict[bytes, Msg] = {}
    for offset, entry in enumerate(entries):
        if entry == "garbage":  # an undecodable value in a call slot
            key = b"c\x1fbad\x1f7\x1fPay.run#0\x1forders\x1f1"
            live.pop(key, None)
            live[key] = Msg(key, b"\x00not avro", offset)
            continue
        short = 0
        if isinstance(entry, tuple):
            _, entry, short = entry
        entry = _with_partition(entry, partition)
        key = entry_key_bytes(entry)
        value = CODEC.encode(entry)
        live.pop(key, None)
        live[key] = Msg(key, value[: max(len(value) - short, 11)], offset)
    return list(live.values())


def _model(partitions: dict[int, list[Msg]]) -> tuple[dict[str, Any], dict[str, int]]:
    """The audit from decoded journal rows, as journal_tables / the summary define it."""
    rows = []
    for p, msgs in partitions.items():
        for m in msgs:
            rows.append({**decode_record(CODEC, m.k, m.v), "partition": p, "offset": m.o})
    call_rows = [r for r in rows if r["kind"] == "call"]
    states: dict[tuple, list[int]] = {}
    for r in rows:
        if r["kind"] in ("call", "done", "truncation"):
            ident = (r["partition"], r["topic"], r["key"], r["seq"], r["action"])
            s = states.setdefault(ident, [0, 0, 0, 0, 0])
            if r["kind"] == "call":
                s[3] += 1
                s[{"PENDING": 0, "FAILED": 1, "SUCCEEDED": 2}[r["status"]]] += 1
            elif r["kind"] == "done":
                s[4] = 1
    in_flight = sorted(
        (
            {
                "partition": ident[0],
                "key": ident[2],
                "seq": ident[3],
                "action": ident[4],
                "pending_calls": s[0],
                "failed_calls": s[1],
                "succeeded_calls": s[2],
                "calls": s[3],
                "_topic": ident[1],
            }
            for ident, s in states.items()
            if not s[4]
        ),
        key=lambda r: (r["partition"], r["seq"], r["action"], r["key"], r["_topic"]),
    )
    stuck = [
        r for r in call_rows if r["status"] == "PENDING" and r["started_ms"] < NOW - STUCK_AFTER
    ]
    waiting = [
        r for r in rows if r["kind"] == "two_phase" and r["phase"] in ("PREPARED", "ABORTING")
    ]
    stuck_two_phase = [r for r in waiting if r["started_ms"] < NOW - STUCK_AFTER]
    failures: dict[Any, list[Any]] = {}
    for r in call_rows:
        if r["status"] == "FAILED":
            f = failures.setdefault(r["exception_type"], [0, set(), []])
            f[0] += 1
            f[1].add(r["function_id"])
            f[2].append((r["exception_message"], r["call_id"]))
    status = Counter((r["action_name"], r["status"]) for r in call_rows)
    tables = {
        "status_counts": [
            {"action_name": a, "status": s, "count": n} for (a, s), n in sorted(status.items())
        ],
        "in_flight": [{k: v for k, v in r.items() if k != "_topic"} for r in in_flight],
        "stuck": stuck,
        "stuck_two_phase": stuck_two_phase,
        "failures": failures,
        "truncations": [r for r in rows if r["kind"] == "truncation"],
        "undecodable": [r for r in rows if r["kind"] == "undecodable"],
    }
    kinds = Counter(r["kind"] for r in rows)
    figures = {
        "journal_records": len(rows),
        "action_states": len(states),
        "completed_action_states": sum(s[4] for s in states.values()),
        "in_flight_action_states": len(in_flight),
        "calls_succeeded": sum(1 for r in call_rows if r["status"] == "SUCCEEDED"),
        "calls_failed": sum(1 for r in call_rows if r["status"] == "FAILED"),
        "calls_pending": sum(1 for r in call_rows if r["status"] == "PENDING"),
        "stuck_calls": len(stuck),
        "two_phase_waiting": len(waiting),
        "stuck_two_phase_calls": len(stuck_two_phase),
        "truncations": kinds["truncation"],
        "undecodable_records": kinds["undecodable"],
        "memory_snapshots": kinds["memory"],
    }
    return tables, figures


def _bag(rows: list[dict[str, Any]], columns: list[str]) -> Counter:
    return Counter(tuple(r.get(c) for c in columns) for r in rows)


def _view(partitions: dict[int, list[Msg]], row_limit: int | None = None) -> pa.Table:
    return pa.Table.from_batches(
        [audit_batch(CODEC, msgs, p, row_limit=row_limit) for p, msgs in partitions.items()],
        schema=AUDIT_ARROW_SCHEMA,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(entries, max_size=40), min_size=1, max_size=3))
def test_one_pass_view_matches_the_journal_model(per_partition):
    partitions = {p: _live(es, p) for p, es in enumerate(per_partition)}
    tables, figures = merge_audit(_view(partitions), now_ms=NOW, stuck_after_ms=STUCK_AFTER)
    want_tables, want_figures = _model(partitions)

    assert figures == want_figures
    got = {name: t.to_pylist() for name, t in tables.items()}
    assert got["status_counts"] == want_tables["status_counts"]
    assert got["in_flight"] == want_tables["in_flight"]
    stuck_cols = ["partition", "key", "seq", "action", "index", "call_id", "function_id",
                  "started_ms", "attempts", "worker_id"]  # fmt: skip
    assert _bag(got["stuck"], stuck_cols) == _bag(want_tables["stuck"], stuck_cols)
    started = [r["started_ms"] for r in got["stuck"]]
    assert started == sorted(started)
    assert all(r["age_s"] == (NOW - r["started_ms"]) / 1000 for r in got["stuck"])
    two_phase_cols = ["partition", "offset", "topic", "key", "seq", "action", "index", "phase",
                      "function_id", "call_id", "round", "attempts", "last_error", "worker_id"]  # fmt: skip
    assert _bag(got["stuck_two_phase"], two_phase_cols) == _bag(
        want_tables["stuck_two_phase"], two_phase_cols
    )
    assert all(r["age_s"] == (NOW - r["prepared_ms"]) / 1000 for r in got["stuck_two_phase"])
    prepared = [r["prepared_ms"] for r in got["stuck_two_phase"]]
    assert prepared == sorted(prepared)
    failures = {r["exception_type"]: r for r in got["failures"]}
    assert set(failures) == set(want_tables["failures"])
    for exc_type, (n, functions, examples) in want_tables["failures"].items():
        row = failures[exc_type]
        assert (row["calls"], row["functions"]) == (n, sorted(functions))
        assert (row["example_message"], row["example_call_id"]) in examples
    counts = [r["calls"] for r in got["failures"]]
    assert counts == sorted(counts, reverse=True)
    trunc_cols = ["partition", "key", "seq", "action", "index", "expected_function_id",
                  "recorded_function_id", "dropped", "at_ms"]  # fmt: skip
    assert _bag(got["truncations"], trunc_cols) == _bag(want_tables["truncations"], trunc_cols)
    bad_cols = ["partition", "offset", "key", "seq", "action", "index", "error"]
    assert _bag(got["undecodable"], bad_cols) == _bag(want_tables["undecodable"], bad_cols)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(entries, max_size=40), st.integers(0, 3))
def test_the_checks_view_holds_the_journal_rows_columns_it_keeps(entries_, partition):
    """What the audit's input and output checks read (projections for most records) is
    what the journal rows say, record for record: damaged bodies, old kinds and all."""
    msgs = _live(entries_, partition)
    rows = journal_batch(
        CODEC,
        [m.k for m in msgs],
        [m.v for m in msgs],
        [partition] * len(msgs),
        [m.o for m in msgs],
        [0] * len(msgs),
    ).to_pylist()
    want = [{c: r[c] for c in CHECK_COLUMNS} for r in rows]
    got = [r for b in check_batches(CODEC, msgs, partition, batch_size=7) for r in b.to_pylist()]
    assert got == want
    for batch in check_batches(CODEC, msgs, partition):
        assert batch.schema == CHECK_ARROW_SCHEMA


def test_a_partition_over_its_row_limit_yields_an_overflow_row_and_merge_refuses_it():
    pending = [
        CallEntry(ActionRef(f"k{i}", i, "Pay.run#0", 0, "orders"), 0, "f", "ab", CallStatus.PENDING)
        for i in range(5)
    ]
    partitions = {0: _live(pending, 0)}
    view = _view(partitions, row_limit=4)
    parts = view.column("part").to_pylist()
    assert parts == ["overflow", "totals"]
    assert view.column("count").to_pylist() == [5 + 5 + 1, 5]  # 5 pending, 5 in flight, 1 status
    with pytest.raises(ValueError, match="overflow"):
        merge_audit(view, now_ms=NOW, stuck_after_ms=STUCK_AFTER)
    assert _view(partitions, row_limit=11).column("part").to_pylist().count("overflow") == 0
