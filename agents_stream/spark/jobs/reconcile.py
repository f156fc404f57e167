"""``spark reconcile``: settle PENDING calls from an external ledger, in the journal.

A PENDING slot is a reconcilable call whose function started but whose outcome was never
journaled (the worker died in between). Normally the restarted worker runs the call's
reconciler. This job settles such slots in bulk from a ledger the external system keeps
(payments, orders...), keyed by the call id the function received (or a column of yours
matched against the record key).

What it writes: for each PENDING slot with a ledger row, one terminal CallResult
(``SUCCEEDED`` with the ledger's result JSON encoded by the app's payload codec, or
``FAILED`` with the ledger's error type and message) to the ActionState topic, with the
*same record key* as the PENDING entry (so compaction replaces it) and to the *same
partition* (the ActionState partition of the input record). Identity fields (function
id, args digest, call id, started time, attempts) are copied from the PENDING entry, so
call matching on replay succeeds. Slots without a ledger row are left PENDING (their
reconciler runs on restart) or, with ``missing="fail"``, settled as FAILED with type
``agents_stream.spark.NotInLedger``.

Why workers must be stopped: a running worker holds the slot in its RocksDB cache and may
itself finalize it concurrently (its reconciler and this job would both write). A worker
that *starts* after the job rebuilds its cache from the ActionState topic, finds a
terminal entry and replays it: neither the function nor the reconciler runs. The job
refuses to write while the app's consumer group has members (``force`` skips the check).

Two-phase calls (``two_phase``, issue 65): the open obligations of two-phase calls
(PREPARED, ABORTING) are settled too, committed or aborted by the rules the workers
follow (:mod:`.reconcile_two_phase`); without a ledger, only they are.

Steps: (1) read and decode the journal, keep PENDING calls; (2) read the ledger and join;
(3) decide per slot (:func:`decide`); (3b) with ``two_phase``, decide and settle the open
obligations (a dry run calls nothing); (4) unless ``dry_run``, write and wait for every
acknowledgement; (5) write the decisions as Parquet when ``out_dir`` is given
(``decisions``, ``two_phase_decisions``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F

from ...app import App
from ...durable.journal import CallEntry, CallStatus, ExceptionInfo
from ...errors import AgentsStreamError, ConfigurationError
from ...kafka.config import admin_config
from ...serde.journal import default_journal_codec
from ..frames.action_state import read_journal
from ..frames.state_writer import ActionStateWriter
from ..shipping import make_importable
from .common import log, require_topics, step
from .progress import planned_records
from .reconcile_two_phase import RECONCILER_ID, TWO_PHASE_DDL, open_obligations, settle_two_phase

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NOT_IN_LEDGER = "agents_stream.spark.NotInLedger"
DECISION_DDL = (
    "partition INT, key STRING, seq BIGINT, action STRING, index INT, call_id STRING, "
    "function_id STRING, decision STRING, result_json STRING, error_type STRING"
)


class ReconcileError(AgentsStreamError):
    """Reconcile cannot proceed safely (e.g. workers of the app are still running)."""


@dataclass(frozen=True)
class Ledger:
    """Where the ledger is and how its columns are named.

    Attributes:
        path: a Parquet or CSV file/directory (CSV needs a header row).
        format: ``parquet`` or ``csv`` (default: from the extension, else parquet).
        id_column: the ledger column holding the match value.
        match_on: ``call_id`` (the call's idempotency key) or ``key`` (the input record
            key: every PENDING call of that key matches).
        status_column: ``SUCCEEDED`` / ``FAILED`` (case-insensitive); a ledger without
            this column means SUCCEEDED.
        result_column: the result as JSON text (SUCCEEDED).
        error_type_column, error_message_column: the error (FAILED).
    """

    path: str
    format: Literal["parquet", "csv"] | None = None
    id_column: str = "call_id"
    match_on: Literal["call_id", "key"] = "call_id"
    status_column: str = "status"
    result_column: str = "result"
    error_type_column: str = "error_type"
    error_message_column: str = "error_message"

    def read(self, spark: SparkSession) -> DataFrame:
        fmt = self.format or ("csv" if str(self.path).endswith(".csv") else "parquet")
        reader = spark.read
        if fmt == "csv":  # RFC 4180: a header row, quotes doubled inside quoted fields
            reader = reader.option("header", "true").option("escape", '"')
        df = reader.format(fmt).load(str(self.path))
        if self.id_column not in df.columns:
            raise ConfigurationError(f"ledger {self.path} has no column {self.id_column!r}")
        wanted = {
            self.id_column: "ledger_id",
            self.status_column: "ledger_status",
            self.result_column: "ledger_result",
            self.error_type_column: "ledger_error_type",
            self.error_message_column: "ledger_error_message",
        }
        return df.select(
            *[
                (F.col(src) if src in df.columns else F.lit(None)).cast("string").alias(dst)
                for src, dst in wanted.items()
            ]
        )


@dataclass
class ReconcileResult:
    summary: dict[str, Any]
    decisions: list[dict[str, Any]] = field(default_factory=list)
    # with two_phase: one row per open obligation (TWO_PHASE_DDL)
    two_phase: list[dict[str, Any]] = field(default_factory=list)


def decide(
    pending: CallEntry,
    ledger: Mapping[str, Any] | None,
    *,
    codec: Any,
    missing: Literal["skip", "fail"] = "skip",
    now_ms: int | None = None,
) -> CallEntry | None:
    """The terminal entry replacing ``pending`` (``None``: leave it PENDING).

    Raises:
        ConfigurationError: the ledger's result is not JSON, or its status is unknown.
    """
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    settled = replace(pending, finished_ms=now_ms, worker_id=RECONCILER_ID)
    if ledger is None:
        if missing == "skip":
            return None
        info = ExceptionInfo(NOT_IN_LEDGER, f"call {pending.call_id} is not in the ledger")
        return replace(settled, status=CallStatus.FAILED, result=None, exception=info)
    status = (ledger.get("ledger_status") or "SUCCEEDED").strip().upper()
    if status in ("FAILED", "FAILURE", "ERROR"):
        info = ExceptionInfo(
            ledger.get("ledger_error_type") or "agents_stream.spark.LedgerFailure",
            ledger.get("ledger_error_message") or "failed according to the ledger",
        )
        return replace(settled, status=CallStatus.FAILED, result=None, exception=info)
    if status not in ("SUCCEEDED", "SUCCESS", "OK"):
        raise ConfigurationError(f"ledger status {status!r} of call {pending.call_id} is unknown")
    text = ledger.get("ledger_result")
    try:
        value = None if text is None else json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"ledger result of call {pending.call_id} is not JSON") from exc
    return replace(settled, status=CallStatus.SUCCEEDED, result=codec.encode(value), exception=None)


def check_stopped(bootstrap: str, group: str, *, wait_s: float = 15.0) -> None:
    """Raises ReconcileError while consumer group ``group`` has members (waits ``wait_s``
    first: a SIGKILLed worker stays a member until its session times out)."""
    admin = AdminClient(admin_config(bootstrap))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            [desc] = [f.result(15) for f in admin.describe_consumer_groups([group]).values()]
            members = len(desc.members)
        except Exception as exc:  # a broker without DescribeGroups: cannot check
            log.warning(
                "reconcile: cannot check group %s (%s); make sure workers are stopped", group, exc
            )
            return
        if members == 0:
            return
        if time.monotonic() > deadline:
            raise ReconcileError(
                f"consumer group {group!r} has {members} active member(s): stop the workers "
                "first (they would finalize the same slots), or pass --force"
            )
        time.sleep(1.0)


def run_reconcile(
    spark: SparkSession,
    app: App,
    bootstrap: str,
    ledger: Ledger | None,
    *,
    missing: Literal["skip", "fail"] = "skip",
    dry_run: bool = False,
    force: bool = False,
    out_dir: str | Path | None = None,
    two_phase: bool = False,
    two_phase_tries: int = 3,
) -> ReconcileResult:
    """Settles PENDING calls of ``app`` from ``ledger`` and, with ``two_phase``, its open
    two-phase obligations (steps in the module docstring); ``ledger`` None: only those.

    Raises:
        ConfigurationError: neither a ledger nor ``two_phase``.
    """
    if ledger is None and not two_phase:
        raise ConfigurationError("nothing to reconcile: give a ledger, or two_phase")
    require_topics(bootstrap, {app.action_state_topic: f"the journal of app {app.id!r}"})
    make_importable(spark.sparkContext, app)  # a cluster's executors import the app
    if not (force or dry_run):
        check_stopped(bootstrap, app.id)
    isolation = {"kafka.isolation.level": "read_committed"} if app.exactly_once else {}
    planned = planned_records(bootstrap, [app.action_state_topic], **isolation)
    codec = default_journal_codec(app.schema_registry_url, app.action_state_topic)
    now_ms = int(time.time() * 1000)
    journal = read_journal(spark, bootstrap, app, include_raw=True, **isolation)
    if ledger is not None and two_phase:
        journal = journal.cache()  # read once for both
    decisions: list[dict[str, Any]] = []
    writes: list[tuple[int, Any]] = []
    summary: dict[str, Any] = {"app": app.id}
    if ledger is not None:
        with step(
            spark, "reconcile", f"find PENDING calls in {app.action_state_topic}", records=planned
        ):
            pending = journal.where("kind = 'call' AND status = 'PENDING'")
            match = "call_id" if ledger.match_on == "call_id" else "key"
            joined = pending.join(
                ledger.read(spark), pending[match] == F.col("ledger_id"), "left"
            ).collect()
        for row in joined:
            entry = codec.decode(b"", row["raw_value"])
            assert isinstance(entry, CallEntry)
            found = row.asDict() if row["ledger_id"] is not None else None
            settled = decide(entry, found, codec=app.payload_codec, missing=missing, now_ms=now_ms)
            decisions.append(_decision(row, settled))
            if settled is not None:
                writes.append((row["partition"], settled))
        summary.update(
            {
                "pending": len(joined),
                "in_ledger": sum(1 for r in joined if r["ledger_id"] is not None),
                "succeeded": sum(1 for d in decisions if d["decision"] == "SUCCEEDED"),
                "failed": sum(1 for d in decisions if d["decision"] == "FAILED"),
                "left_pending": sum(1 for d in decisions if d["decision"] == "PENDING"),
            }
        )
    two_phase_decisions: list[dict[str, Any]] = []
    if two_phase:
        with step(
            spark, "reconcile", f"find open two-phase calls in {app.action_state_topic}",
            records=planned,
        ):  # fmt: skip
            rows = open_obligations(journal)
        # The user's commit/abort run here, on the driver: the app's module (imported
        # with the app) defines the callables the journal names.
        counts, two_phase_decisions, settled_writes = settle_two_phase(
            rows, codec, app.payload_codec, dry_run=dry_run, tries=two_phase_tries,
            now_ms=now_ms,
        )  # fmt: skip
        writes += settled_writes
        summary.update(counts)
    if ledger is not None and two_phase:
        journal.unpersist()
    if writes and not dry_run:
        with (
            step(spark, "reconcile", f"write {len(writes)} journal records"),
            ActionStateWriter(bootstrap, app.action_state_topic, codec) as writer,
        ):
            writer.write(writes)
    summary["written"] = 0 if dry_run else len(writes)
    summary["dry_run"] = dry_run
    log.info("reconcile: %s", summary)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
        if decisions:
            spark.createDataFrame(decisions, DECISION_DDL).write.mode("overwrite").parquet(
                str(Path(out_dir) / "decisions")
            )
        if two_phase_decisions:
            spark.createDataFrame(two_phase_decisions, TWO_PHASE_DDL).write.mode(
                "overwrite"
            ).parquet(str(Path(out_dir) / "two_phase_decisions"))
    return ReconcileResult(summary, decisions, two_phase_decisions)


def _decision(row: Any, settled: CallEntry | None) -> dict[str, Any]:
    return {
        "partition": row["partition"],
        "key": row["key"],
        "seq": row["seq"],
        "action": row["action"],
        "index": row["index"],
        "call_id": row["call_id"],
        "function_id": row["function_id"],
        "decision": "PENDING" if settled is None else settled.status.value,
        "result_json": row["ledger_result"] if settled is not None else None,
        "error_type": settled.exception.type if settled and settled.exception else None,
    }
