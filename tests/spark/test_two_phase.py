"""Two-phase calls (issue 65) in the Spark jobs: journal rows and the audit's stuck
obligations (the one-pass view and the Spark path agree), and ``spark reconcile
--two-phase`` deciding by the workers' rules (commit: below the marker with its
ActionDone; abort: ABORTING, or below the marker without one; else left open), calling
the user's commit/abort with the call id when asked for, and journaling the outcome."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import pyarrow as pa
import pytest

from agents_stream import App, TwoPhaseCommitCallable
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    CompletionGroup,
    InputProgress,
    TwoPhase,
    TwoPhaseCall,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.durable.payload import JSON
from agents_stream.durable.values import encode_value
from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark.frames.journal_audit import audit_batch, merge_audit
from agents_stream.spark.frames.journal_rows import JOURNAL_DDL, journal_batch
from agents_stream.spark.jobs.reconcile_two_phase import (
    decide_obligation,
    settle_obligation,
    settle_two_phase,
)

CODEC = default_journal_codec()
NOW, STUCK_AFTER = 10_000_000, 60_000
called: list[tuple[str, str, object]] = []  # (method, order, what it was given)
failing: set[str] = set()  # orders whose commit/abort raise


@dataclass
class Hold(TwoPhaseCommitCallable[dict]):
    order: str

    def prepare(self, call_id: str) -> dict:
        return {"hold": call_id}

    def commit(self, call_id: str, prepared: dict) -> None:  # takes the call id
        if self.order in failing:
            raise ConnectionError(f"psp down for {self.order}")
        called.append(("commit", self.order, (call_id, prepared)))

    def abort(self, prepared: dict) -> None:
        if self.order in failing:
            raise ConnectionError(f"psp down for {self.order}")
        called.append(("abort", self.order, prepared))


def ref(seq: int, key: str | None = None, partition: int = 0) -> ActionRef:
    return ActionRef(key or f"o{seq}", seq, "Orders.pay#0", partition, "orders")


def obligation(seq: int, phase: TwoPhase = TwoPhase.PREPARED, **kw) -> TwoPhaseCall:
    r = kw.pop("ref", None) or ref(seq)
    order = r.key
    return TwoPhaseCall(
        r, 0, "tests.Hold", "d" * 16, phase, encode_value(Hold(order)),
        JSON.encode({"hold": f"h-{order}"}), call_id=r.call_id("app", 0),
        prepared_ms=kw.pop("prepared_ms", NOW - 3_600_000), **kw,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _clean():
    called.clear()
    failing.clear()


def test_decisions_follow_the_workers_rules():
    below, above = obligation(3), obligation(12)
    assert decide_obligation(below, 10, done=True) == "commit"
    assert decide_obligation(below, 10, done=False) == "abort"  # skipped by a reset
    assert decide_obligation(above, 10, done=True) is None  # its next run decides
    assert decide_obligation(below, None, done=True) is None  # no marker: not known below
    assert decide_obligation(obligation(12, TwoPhase.ABORTING), None, done=True) == "abort"
    assert decide_obligation(obligation(3, TwoPhase.COMMITTED), 10, done=True) is None


def test_settling_calls_commit_with_the_round_call_id_and_journals_the_outcome():
    x = obligation(3, round=1, attempts=2, last_error="psp.Timeout: slow")
    settled = settle_obligation(x, "commit", JSON, now_ms=NOW)
    assert called == [("commit", "o3", (f"{x.call_id}~1", {"hold": "h-o3"}))]
    assert settled.returned and settled.entry is not None
    assert settled.entry == replace(
        x, phase=TwoPhase.COMMITTED, settled_ms=NOW, attempts=3, worker_id="spark-reconcile"
    )
    aborted = settle_obligation(obligation(4), "abort", JSON, now_ms=NOW).entry
    assert called[-1] == ("abort", "o4", {"hold": "h-o4"})  # no call_id parameter
    assert aborted is not None and (aborted.phase, aborted.attempts) == (TwoPhase.ABORTED, 1)


def test_an_abort_that_keeps_failing_is_journaled_decided_with_its_error():
    failing.add("o5")
    settled = settle_obligation(obligation(5), "abort", JSON, tries=2, backoff_s=0, now_ms=NOW)
    assert not settled.returned and called == []
    assert settled.entry is not None and settled.entry.phase is TwoPhase.ABORTING
    assert settled.entry.attempts == 2 and settled.entry.settled_ms == 0
    assert settled.entry.last_error == "builtins.ConnectionError: psp down for o5"
    failed = settle_obligation(obligation(6), "commit", JSON, tries=1, now_ms=NOW).entry
    assert called[-1][0] == "commit" and failed is not None  # o6 does not fail
    failing.add("o7")
    kept = settle_obligation(obligation(7), "commit", JSON, tries=1, now_ms=NOW).entry
    assert kept is not None and kept.phase is TwoPhase.PREPARED  # a commit stays owed


def _rows(entries: list[tuple[int, object]]) -> list[dict]:
    """Journal rows of ``(partition, entry)`` records, as the reader yields them."""
    batch = journal_batch(
        CODEC,
        [entry_key_bytes(e) for _, e in entries],
        [CODEC.encode(e) for _, e in entries],
        [p for p, _ in entries],
        list(range(len(entries))),
        [1] * len(entries),
        include_raw=True,
    )
    return batch.to_pylist()


def _journal() -> list[tuple[int, object]]:
    """Partition 0, marker at 10: o3 completed (in a group) -> commit, o4 never
    completed -> abort, o12 above the marker -> open, o2 ABORTING -> abort, o1 settled;
    partition 1 (no marker): o5 PREPARED -> open, fresh (not stuck)."""
    return [
        (0, InputProgress("orders", 0, 10)),
        (0, CallEntry(ref(3), 0, "tests.Hold", "d" * 16, CallStatus.SUCCEEDED, b"{}")),
        (0, obligation(3)),
        (0, CompletionGroup("orders", 0, "g1", (ActionDone(ref(3)), ActionDone(ref(9))))),
        (0, obligation(4)),
        (0, obligation(12)),
        (0, ActionDone(ref(12))),
        (0, obligation(2, TwoPhase.ABORTING, attempts=4, last_error="psp.Down")),
        (0, obligation(1, TwoPhase.COMMITTED)),
        (1, obligation(5, ref=ref(5, partition=1), prepared_ms=NOW - 1000)),
    ]


@pytest.mark.spark
def test_audit_and_reconcile_find_the_open_obligations_in_spark(spark):
    """The Spark path's stuck two-phase table equals the one-pass view's; the reconcile
    job's join gives each open obligation its ActionDone and marker."""
    from agents_stream.spark.jobs.audit import journal_tables
    from agents_stream.spark.jobs.reconcile_two_phase import open_obligations

    rows = _rows(_journal())
    assert {r["kind"] for r in rows} >= {"two_phase", "done", "progress", "call"}
    journal = spark.createDataFrame(rows, JOURNAL_DDL).cache()
    tables = journal_tables(journal, stuck_after_ms=STUCK_AFTER, now_ms=NOW)
    stuck = tables["stuck_two_phase"].toArrow().to_pylist()
    assert sorted((r["key"], r["phase"], r["attempts"]) for r in stuck) == [
        ("o12", "PREPARED", 0), ("o2", "ABORTING", 4), ("o3", "PREPARED", 0),
        ("o4", "PREPARED", 0),
    ]  # fmt: skip
    assert {r["key"]: r["last_error"] for r in stuck}["o2"] == "psp.Down"
    assert all(r["age_s"] == 3600.0 for r in stuck)

    class Msg:
        def __init__(self, key: bytes, value: bytes, offset: int) -> None:
            self.k, self.v, self.o = key, value, offset

        def key(self) -> bytes:
            return self.k

        def value(self) -> bytes:
            return self.v

        def offset(self) -> int:
            return self.o

    view = pa.Table.from_batches(
        [
            audit_batch(
                CODEC,
                [Msg(r["key"], r["value"], i) for i, r in enumerate(_kafka(_journal(), p))],
                p,
            )
            for p in (0, 1)
        ]
    )
    one_pass, figures = merge_audit(view, now_ms=NOW, stuck_after_ms=STUCK_AFTER)
    columns = ["partition", "key", "seq", "action", "index", "phase", "prepared_ms", "attempts"]
    by_view = sorted(tuple(r[c] for c in columns) for r in one_pass["stuck_two_phase"].to_pylist())
    assert by_view == sorted(tuple(r[c] for c in columns) for r in stuck)
    assert (figures["two_phase_waiting"], figures["stuck_two_phase_calls"]) == (5, 4)

    open_rows = open_obligations(journal)
    found = {r["key"]: (r["done"], r["through"]) for r in open_rows}
    assert found == {
        "o3": (True, 10), "o4": (None, 10), "o12": (True, 10), "o2": (None, 10),
        "o5": (None, None),
    }  # fmt: skip
    counts, decisions, writes = settle_two_phase(open_rows, CODEC, JSON, now_ms=NOW)
    journal.unpersist()
    assert sorted((d["key"], d["decision"], d["outcome"]) for d in decisions) == [
        ("o12", "undecided", "open"), ("o2", "abort", "aborted"),
        ("o3", "commit", "committed"), ("o4", "abort", "aborted"),
        ("o5", "undecided", "open"),
    ]  # fmt: skip
    assert sorted((c[0], c[1]) for c in called) == [("abort", "o2"), ("abort", "o4"),
                                                   ("commit", "o3")]  # fmt: skip
    assert counts == {
        "two_phase_open": 5, "two_phase_committed": 1, "two_phase_aborted": 2,
        "two_phase_failed": 0, "two_phase_left_open": 2,
    }  # fmt: skip
    assert sorted((p, e.ref.key, e.phase.value) for p, e in writes) == [
        (0, "o2", "ABORTED"), (0, "o3", "COMMITTED"), (0, "o4", "ABORTED"),
    ]  # fmt: skip


def _kafka(entries: list[tuple[int, object]], partition: int) -> list[dict]:
    return [
        {"key": entry_key_bytes(e), "value": CODEC.encode(e)} for p, e in entries if p == partition
    ]


@pytest.mark.broker
@pytest.mark.spark
def test_spark_audit_reports_and_reconcile_settles_open_obligations(
    spark, broker, topic_factory, tmp_path
):
    """End to end on the broker: the audit lists the stuck two-phase calls, a dry run
    decides without calling or writing, the run commits and aborts and journals it (the
    audit then finds only the undecided ones)."""
    from agents_stream.spark.frames import ActionStateWriter
    from agents_stream.spark.jobs.audit import run_audit
    from agents_stream.spark.jobs.reconcile import run_reconcile
    from agents_stream.testing.topics import create_topics, read_topic

    app = App(topic_factory("app"), prune_completed=False, partitions=2)
    create_topics(broker.bootstrap, [app.action_state_topic], partitions=2)
    with ActionStateWriter(broker.bootstrap, app.action_state_topic) as writer:
        writer.write(_journal())  # type: ignore[arg-type]

    audit = run_audit(spark, app, broker.bootstrap, tmp_path / "audit", inputs=False,
                      outputs=False, stuck_after_s=STUCK_AFTER / 1000, now_ms=NOW)  # fmt: skip
    assert (audit.summary["two_phase_waiting"], audit.summary["stuck_two_phase_calls"]) == (5, 4)
    assert "## stuck two phase (4)" in (tmp_path / "audit" / "report.md").read_text()
    split = run_audit(spark, app, broker.bootstrap, None, inputs=False, outputs=False,
                      stuck_after_s=STUCK_AFTER / 1000, now_ms=NOW,
                      maxRecordsPerPartition=4)  # fmt: skip
    assert split.summary == audit.summary  # the Spark path's figures and table agree

    def rows(result):
        return sorted(tuple(r) for r in result.tables["stuck_two_phase"].collect())

    assert rows(split) == rows(audit) and len(rows(audit)) == 4

    started = time.monotonic()
    dry = run_reconcile(spark, app, broker.bootstrap, None, two_phase=True, dry_run=True)
    assert called == [] and dry.summary["written"] == 0
    assert sorted(d["outcome"] for d in dry.two_phase) == ["dry run"] * 3 + ["open"] * 2
    done = run_reconcile(
        spark, app, broker.bootstrap, None, two_phase=True, force=True, out_dir=tmp_path / "rec"
    )
    assert time.monotonic() - started < 60
    assert done.summary["written"] == 3 and done.summary["two_phase_committed"] == 1
    assert sorted((c[0], c[1]) for c in called) == [("abort", "o2"), ("abort", "o4"),
                                                   ("commit", "o3")]  # fmt: skip
    assert spark.read.parquet(str(tmp_path / "rec" / "two_phase_decisions")).count() == 5

    latest: dict[str | None, object] = {}
    for m in read_topic(broker.bootstrap, app.action_state_topic):
        assert m.value is not None
        latest[m.key] = CODEC.decode((m.key or "").encode(), m.value)
    phases = {
        e.ref.key: (e.phase, e.worker_id) for e in latest.values() if isinstance(e, TwoPhaseCall)
    }
    assert phases["o3"] == (TwoPhase.COMMITTED, "spark-reconcile")
    assert phases["o4"] == phases["o2"] == (TwoPhase.ABORTED, "spark-reconcile")
    assert phases["o12"][0] is phases["o5"][0] is TwoPhase.PREPARED
