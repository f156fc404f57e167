"""``spark audit``: what the ActionState, input and output topics of an app say happened.

Read-only: nothing is written to Kafka and no consumer group offsets are committed (the
app's group is only *asked* for its committed offsets). Steps, each a named Spark job:

1. Read the ActionState topic, apply compaction and decode it (any schema version).
2. Tables from the journal: calls per action and status (``status_counts``), ActionStates
   without an ActionDone (``in_flight``), PENDING calls started longer ago than the
   threshold (``stuck``), two-phase calls (v8) still waiting for their commit or abort
   (PREPARED or ABORTING) prepared longer ago than the same threshold
   (``stuck_two_phase``: settle them with ``spark reconcile --two-phase``), FAILED calls
   by exception type (``failures``), truncations (``truncations``: non-determinism
   evidence) and undecodable records (``undecodable``).

   Steps 1 and 2 are one Spark job: each partition's reader compacts and decodes its
   Kafka partition and does the per-ActionState work there (an ActionState's records
   share a partition), yielding only what the tables show; the driver merges those
   partial results (:mod:`..frames.journal_audit`). When a partition is split over
   readers (``maxRecordsPerPartition`` / ``minPartitions``) or the partial results are
   too many to collect (:data:`VIEW_ROW_LIMIT`), the decoded journal is cached and the
   tables are computed in Spark instead (:func:`journal_tables`), to the same result.
   Steps 3 and 4 join the decoded journal (read again, cached) with the topics.
3. ``missing_inputs``: input records (per agent binding) for which not every ActionState
   of that record is completed. A record is matched to its ActionStates by input topic,
   partition, offset and key, so two input topics at the same partition/offset never
   vouch for each other; entries journaled before v5 carry no topic and belong to the
   app's first input topic (as in the worker's store). ``committed`` says whether the
   app's group already committed past the record on its topic: with
   ``App(prune_completed=True)`` the states of committed records are tombstoned, so only
   uncommitted missing inputs are anomalies there.
4. ``duplicate_outputs``: output records (of agents and Async I/O operators; ``agent``
   is ``async_io:<fn>`` for the latter) grouped by key and content. Where every record
   of a group carries its identity (the ``x-agents-stream-output`` header every host
   writes), the surplus over its distinct identities is exact, also once the journal
   was pruned, and two actions that legitimately sent the same content are not
   flagged. Otherwise a group is counted against the outputs the journal's ActionDone
   records hold for that key and content (at least one, at least its identities): any
   surplus is a duplicate emission.
5. Write every table as Parquet under ``out_dir/<table>/``, ``summary.json``, and the
   reports ``report.md`` (+ ``calls_by_status.svg``) and ``report.html``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from ...app import App
from ...durable.journal import TwoPhase
from ...durable.output_identity import OUTPUT_HEADER
from ..frames.action_state import (
    action_states,
    read_audit_view,
    read_check_view,
    read_journal,
    splits_partitions,
)
from ..frames.journal_audit import merge_audit
from ..shipping import make_importable
from ..source.datasource import read_kafka
from . import report
from .common import committed_offsets, log, partition_counts, require_topics, step
from .progress import planned_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TABLES = (
    "status_counts",
    "in_flight",
    "stuck",
    "stuck_two_phase",
    "failures",
    "truncations",
    "undecodable",
    "missing_inputs",
    "duplicate_outputs",
)


@dataclass
class AuditResult:
    """Summary figures, the audit tables (lazy DataFrames) and where they were written."""

    summary: dict[str, Any]
    tables: Mapping[str, DataFrame]
    out_dir: Path | None = None
    reports: list[Path] = field(default_factory=list)


def _agent_of(action_name_col: Any) -> Any:
    return F.substring_index(action_name_col, ".", 1)


def journal_tables(
    journal: DataFrame,
    *,
    stuck_after_ms: int,
    now_ms: int,
    states: DataFrame | None = None,
) -> dict[str, DataFrame]:
    """The tables that need only the decoded journal (step 2); ``states`` defaults to
    :func:`~agents_stream.spark.frames.action_state.action_states` of ``journal``."""
    calls = journal.where(F.col("kind") == "call")
    waiting = journal.where((F.col("kind") == "two_phase") & F.col("phase").isin(*OPEN_PHASES))
    states = states if states is not None else action_states(journal)
    return {
        "status_counts": calls.groupBy("action_name", "status")
        .count()
        .orderBy("action_name", "status"),
        "in_flight": states.where(~F.col("completed"))
        .select(
            "partition",
            "key",
            "seq",
            "action",
            "pending_calls",
            "failed_calls",
            "succeeded_calls",
            (F.col("call_count") if "call_count" in states.columns else F.size("calls")).alias(
                "calls"
            ),
        )
        .orderBy("partition", "seq", "action"),
        "stuck": calls.where(
            (F.col("status") == "PENDING") & (F.col("started_ms") < F.lit(now_ms - stuck_after_ms))
        )
        .select(
            "partition",
            "key",
            "seq",
            "action",
            "index",
            "call_id",
            "function_id",
            "started_ms",
            ((F.lit(now_ms) - F.col("started_ms")) / 1000).alias("age_s"),
            "attempts",
            "worker_id",
        )
        .orderBy("started_ms"),
        "stuck_two_phase": waiting.where(F.col("started_ms") < F.lit(now_ms - stuck_after_ms))
        .select(
            "partition",
            "offset",
            "topic",
            "key",
            "seq",
            "action",
            "index",
            "phase",
            "function_id",
            "call_id",
            F.col("started_ms").alias("prepared_ms"),  # a two_phase row's preparation time
            ((F.lit(now_ms) - F.col("started_ms")) / 1000).alias("age_s"),
            "round",
            "attempts",
            "last_error",
            "worker_id",
        )
        .orderBy("prepared_ms"),
        "failures": calls.where(F.col("status") == "FAILED")
        .groupBy("exception_type")
        .agg(
            F.count("*").alias("calls"),
            F.array_sort(F.collect_set("function_id")).alias("functions"),
            F.first("exception_message").alias("example_message"),
            F.first("call_id").alias("example_call_id"),
        )
        .orderBy(F.desc("calls")),
        "truncations": journal.where(F.col("kind") == "truncation").select(
            "partition",
            "key",
            "seq",
            "action",
            "index",
            "expected_function_id",
            "recorded_function_id",
            "expected_args_digest",
            "recorded_args_digest",
            "dropped",
            "at_ms",
        ),
        "undecodable": journal.where(F.col("kind") == "undecodable").select(
            "partition", "offset", "key", "seq", "action", "index", "error"
        ),
    }


OPEN_PHASES = (TwoPhase.PREPARED.value, TwoPhase.ABORTING.value)
"""Phases of a two-phase obligation that still owes a commit or an abort."""


def state_counts(journal: DataFrame) -> DataFrame:
    """What the audit needs of :func:`~agents_stream.spark.frames.action_state.action_states`:
    one row per ActionState with its call counts and whether it completed, without the
    nested call slots (``call_count`` instead of ``calls``).

    Counting aggregates partially before the shuffle; collecting every call's struct does
    not, and cost the audit more than decoding.
    """
    # The rows action_states groups: a truncation alone makes an (in-flight) ActionState.
    rows = journal.where(F.col("kind").isin("call", "done", "truncation"))
    is_call = F.col("kind") == "call"

    def count_status(status: str) -> Any:
        return F.sum(F.when(is_call & (F.col("status") == status), 1).otherwise(0))

    return rows.groupBy("partition", "topic", "key", "seq", "action").agg(
        F.sum(F.when(is_call, 1).otherwise(0)).alias("call_count"),
        count_status("PENDING").alias("pending_calls"),
        count_status("FAILED").alias("failed_calls"),
        count_status("SUCCEEDED").alias("succeeded_calls"),
        F.max(F.col("kind") == "done").alias("completed"),
    )


def input_topic(topic_col: Any, legacy_topic: str | None) -> Any:
    """The input topic an ActionState belongs to: its own, or ``legacy_topic`` for an
    entry journaled before v5 (topic ``""``); ``None`` leaves those unmatched."""
    if legacy_topic is None:
        return topic_col
    return F.when(topic_col == "", F.lit(legacy_topic)).otherwise(topic_col)


def missing_inputs(
    journal: DataFrame,
    inputs: DataFrame,
    committed: DataFrame | None = None,
    *,
    legacy_topic: str | None,
) -> DataFrame:
    """Input records without a completed ActionState (step 3).

    Args:
        journal: decoded journal rows.
        inputs: ``agent, topic, partition, offset, key`` of the input records.
        committed: ``agent, topic, partition, committed`` offsets of the app's group, or
            None.
        legacy_topic: the input topic owning pre-v5 entries (the app's first input
            topic, ``App.input_topics[0]``).
    """
    # state_counts, not action_states: only completion counts here, and counting
    # aggregates before the shuffle where collecting call structs does not.
    per_record = (
        state_counts(journal)
        .withColumn("agent", _agent_of(F.col("action")))
        .withColumn("topic", input_topic(F.col("topic"), legacy_topic))
        .groupBy("agent", "topic", "partition", "key", "seq")
        .agg(F.min(F.col("completed").cast("int")).alias("all_done"))
    )
    # Inputs below their partition's completed-through marker are done even though
    # pruning removed their ActionStates (guarantee 8): not missing state.
    markers = (
        journal.where(F.col("kind") == "progress")
        .groupBy("topic", "partition")
        .agg(F.max("seq").alias("completed_through"))
    )
    pending = (
        inputs.join(markers, ["topic", "partition"], "left")
        .where(
            F.col("completed_through").isNull() | (F.col("offset") >= F.col("completed_through"))
        )
        .drop("completed_through")
    )
    joined = pending.join(
        per_record.withColumnRenamed("seq", "offset"),
        ["agent", "topic", "partition", "key", "offset"],
        "left",
    ).where(F.col("all_done").isNull() | (F.col("all_done") == 0))
    out = joined.select(
        "agent",
        "topic",
        "partition",
        "offset",
        "key",
        F.when(F.col("all_done").isNull(), "absent").otherwise("in_flight").alias("state"),
    )
    if committed is None:
        return out.withColumn("committed", F.lit(None).cast("boolean"))
    return (
        out.join(committed, ["agent", "topic", "partition"], "left")
        .withColumn("committed", F.coalesce(F.col("offset") < F.col("committed"), F.lit(False)))
        .select(*out.columns, "committed")
    )


def duplicate_outputs(
    journal: DataFrame,
    outputs: DataFrame,
    routes: DataFrame | None = None,
    *,
    legacy_topic: str | None = None,
) -> DataFrame:
    """Output (key, content) groups with more records than the journal accounts for.

    Args:
        journal: decoded journal rows.
        outputs: ``agent, topic, key, value`` (value as text) of the output records, and
            optionally ``output_id``, the output's identity header (null: none).
        routes: ``agent, input, topic``: the output topic of each agent binding, so that
            an agent bound to two inputs has each output topic checked against the
            completions of its own input; ``None`` counts them per agent only.
        legacy_topic: the input topic owning pre-v5 entries (see :func:`missing_inputs`).
    """
    done = journal.where(F.col("kind") == "done").select(
        _agent_of(F.col("action_name")).alias("agent"),
        input_topic(F.col("topic"), legacy_topic).alias("input"),
        "key",
        F.explode("outputs_json").alias("value"),
    )
    on = ["agent", "key", "value"]
    if routes is not None:
        done, on = done.join(routes, ["agent", "input"]), ["agent", "topic", "key", "value"]
    expected = done.groupBy(*on).agg(F.count("*").alias("expected"))
    if "output_id" not in outputs.columns:
        outputs = outputs.withColumn("output_id", F.lit(None).cast("string"))
    seen = outputs.groupBy("agent", "topic", "key", "value").agg(
        F.count("*").alias("records"),
        F.count("output_id").alias("identified"),
        F.countDistinct("output_id").alias("identities"),
    )
    # Identities are exact; records without one are only told apart by the journal.
    allowed = F.when(F.col("identified") == F.col("records"), F.col("identities")).otherwise(
        F.greatest("expected", "identities", F.lit(1))
    )
    return (
        seen.join(expected, on, "left")
        .withColumn("expected", F.coalesce("expected", F.lit(0)))
        .withColumn("duplicates", F.col("records") - allowed)
        .where(F.col("duplicates") > 0)
        .select("agent", "topic", "key", "value", "records", "identified", "expected", "duplicates")
        .orderBy(F.desc("duplicates"), "key")
    )


def run_audit(
    spark: SparkSession,
    app: App,
    bootstrap: str,
    out_dir: str | Path | None,
    *,
    stuck_after_s: float = 300.0,
    now_ms: int | None = None,
    inputs: bool = True,
    outputs: bool = True,
    **read_options: Any,
) -> AuditResult:
    """Audits ``app`` (steps in the module docstring) and writes the results.

    Args:
        spark: the session.
        app: the app whose topics are audited (``<id>-action-state``, each binding's
            input and output topics).
        bootstrap: bootstrap servers.
        out_dir: directory for Parquet tables and reports; ``None`` writes nothing.
        stuck_after_s: a PENDING call started longer ago than this is *stuck*; so is a
            two-phase call still owing its commit or abort prepared longer ago.
        now_ms: the audit's notion of now (epoch ms; default the wall clock).
        inputs: compute ``missing_inputs`` (reads every input topic).
        outputs: compute ``duplicate_outputs`` (reads every output topic).
        **read_options: options for reading the ActionState topic, e.g.
            ``maxRecordsPerPartition=200_000``.
    """
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    stuck_after_ms = int(stuck_after_s * 1000)
    if app.exactly_once:  # aborted transactions' ActionDones never happened
        read_options.setdefault("kafka.isolation.level", "read_committed")
    topic = app.action_state_topic
    require_topics(bootstrap, {topic: f"the journal of app {app.id!r}"})
    make_importable(spark.sparkContext, app)  # a cluster's executors import the app
    state_records = planned_records(bootstrap, [topic], **read_options)
    one_pass: tuple[dict[str, pa.Table], dict[str, int]] | None = None
    if not splits_partitions(read_options):
        with step(spark, "audit", f"read and decode {topic}", records=state_records):
            one_pass = _one_pass(spark, app, bootstrap, now_ms, stuck_after_ms, read_options)
    joins = (inputs and bool(app.agents)) or (outputs and any(b.output for b in app.agents))
    journal: DataFrame | None = None
    states: DataFrame | None = None
    heads: dict[str, pa.Table] = {}
    if one_pass is not None:
        heads, figures = one_pass
        tables: dict[str, DataFrame] = {}
        if joins:  # the checks' columns only
            journal = read_check_view(spark, bootstrap, app, **read_options).cache()
    else:
        with step(spark, "audit", f"read and decode {topic}", records=state_records):
            journal = read_journal(spark, bootstrap, app, **read_options).drop("raw_value").cache()
            # Journal records, not rows: a completion group (v7) is a row per ActionDone.
            records = journal.select("partition", "offset").distinct().count()
            states = state_counts(journal).cache()
        tables = journal_tables(
            journal, stuck_after_ms=stuck_after_ms, now_ms=now_ms, states=states
        )
    if inputs and app.agents:
        assert journal is not None
        tables["missing_inputs"] = _missing_inputs(spark, app, bootstrap, journal)
    if outputs and any(b.output for b in app.agents):
        assert journal is not None
        tables["duplicate_outputs"] = _duplicate_outputs(spark, app, bootstrap, journal)
    # Each check joins the journal with a topic read from Kafka; the summary counts it
    # and the writer takes its head and maybe all of it: computed once, not per action.
    joined = [tables[name] for name in ("missing_inputs", "duplicate_outputs") if name in tables]
    for table in joined:
        table.cache()
    # Input and output topics are read by the summary's actions (the checks are cached
    # from then on, the journal too).
    topics = [b.input for b in app.agents if inputs] + [b.output for b in app.agents if outputs]
    topic_records = planned_records(bootstrap, sorted({t for t in topics if t}))
    with step(spark, "audit", "summarize", records=topic_records):
        if one_pass is None:
            assert journal is not None and states is not None
            figures = _journal_figures(journal, states, records, now_ms, stuck_after_ms)
        summary = _summary(app, figures, tables, now_ms, stuck_after_s)
    result = AuditResult(summary, AuditTables(spark, heads, tables))
    if out_dir is not None:
        with step(
            spark,
            "audit",
            f"write Parquet tables and reports to {out_dir}",
            records=topic_records,
        ):
            _write(result, Path(out_dir), app)
    for table in joined:
        table.unpersist()
    if states is not None:
        states.unpersist()
    if journal is not None:
        journal.unpersist()
    return result


VIEW_ROW_LIMIT = 200_000
"""About the most rows of the one-pass view (in-flight ActionStates, PENDING calls,
truncations, undecodable records, and a few counts per partition) that the driver
collects, shared among the partitions (at least 1,000 each); above it the audit
computes its tables in Spark from the decoded journal."""


def _one_pass(
    spark: SparkSession,
    app: App,
    bootstrap: str,
    now_ms: int,
    stuck_after_ms: int,
    read_options: Mapping[str, Any],
) -> tuple[dict[str, pa.Table], dict[str, int]] | None:
    """The journal tables and figures from one read of the ActionState topic whose
    partition readers do the per-ActionState work (:mod:`..frames.journal_audit`), or
    ``None`` if the view is too large to collect (:data:`VIEW_ROW_LIMIT`).

    One Spark job, which collects the view: a job costs this machine 0.3-0.6 s whatever
    its size, more than the figures themselves; the Spark path runs about ten. Each
    reader yields at most its share of :data:`VIEW_ROW_LIMIT` rows, so the driver never
    collects more than that; past it, the caller reads the journal again in Spark.
    """
    partitions = partition_counts(bootstrap, [app.action_state_topic]).get(
        app.action_state_topic, 1
    )
    limit = max(VIEW_ROW_LIMIT // max(partitions, 1), min(VIEW_ROW_LIMIT, 1000))
    collected = read_audit_view(spark, bootstrap, app, row_limit=limit, **read_options).toArrow()
    overflow = pc.sum(pc.equal(collected["part"], "overflow")).as_py()
    if overflow:
        log.info(
            "audit: %d partition(s) hold more than %d rows of the one-pass view: "
            "tables computed in Spark",
            overflow,
            limit,
        )
        return None
    return merge_audit(collected, now_ms=now_ms, stuck_after_ms=stuck_after_ms)


class AuditTables(Mapping[str, "DataFrame"]):
    """The audit's tables by name, in :data:`TABLES` order. Those the driver computed
    (the one-pass journal tables) become DataFrames only when asked for: creating one
    costs ~20 ms of the driver's time, and the audit itself writes them without Spark."""

    def __init__(
        self, spark: SparkSession, computed: Mapping[str, pa.Table], frames: dict[str, DataFrame]
    ) -> None:
        self._spark, self._computed, self._frames = spark, computed, frames

    def __getitem__(self, name: str) -> DataFrame:
        frame = self._frames.get(name)
        if frame is None:
            if name not in self._computed:
                raise KeyError(name)
            frame = self._frames[name] = self._spark.createDataFrame(self._computed[name])
        return frame

    def __iter__(self) -> Iterator[str]:
        present = self._frames.keys() | self._computed.keys()
        return iter([name for name in TABLES if name in present])

    def __len__(self) -> int:
        return len(self._frames.keys() | self._computed.keys())

    def arrow(self, name: str) -> pa.Table | None:
        """The table as the driver computed it, or ``None`` if Spark computes it."""
        return self._computed.get(name)


def _missing_inputs(spark: SparkSession, app: App, bootstrap: str, journal: DataFrame) -> DataFrame:
    frames, committed_rows = [], []
    counts = partition_counts(bootstrap, [b.input for b in app.agents])
    for binding in app.agents:
        if binding.input not in counts:
            log.warning("audit: input topic %s does not exist; skipped", binding.input)
            continue
        raw = read_kafka(spark, bootstrap, binding.input, includeHeaders="false")
        frames.append(
            raw.select(
                F.lit(binding.name).alias("agent"),
                "topic",
                "partition",
                "offset",
                F.col("key").cast("string").alias("key"),
            )
        )
        offsets = committed_offsets(bootstrap, app.id, binding.input, counts[binding.input])
        committed_rows += [(binding.name, binding.input, p, o) for p, o in offsets.items()]
    if not frames:
        return spark.createDataFrame(
            [],
            "agent string, topic string, partition int, offset long, key string, "
            "state string, committed boolean",
        )
    inputs = frames[0]
    for frame in frames[1:]:
        inputs = inputs.unionByName(frame)
    committed = spark.createDataFrame(
        committed_rows, "agent string, topic string, partition int, committed long"
    )
    return missing_inputs(journal, inputs, committed, legacy_topic=app.input_topics[0])


def _duplicate_outputs(
    spark: SparkSession, app: App, bootstrap: str, journal: DataFrame
) -> DataFrame:
    # Async I/O operators journal nothing: their outputs are told apart by identity only.
    producers = [(b.name, b.output) for b in app.agents if b.output]
    producers += [(f"async_io:{a.name}", a.output) for a in app.async_ios]
    counts = partition_counts(bootstrap, [t for _, t in producers])
    frames = []
    for name, topic in producers:
        if topic not in counts:
            continue
        raw = read_kafka(spark, bootstrap, topic, includeHeaders="true")
        ident = F.filter("headers", lambda h: h["key"] == OUTPUT_HEADER)
        frames.append(
            raw.select(
                F.lit(name).alias("agent"),
                "topic",
                F.col("key").cast("string").alias("key"),
                F.col("value").cast("string").alias("value"),
                F.element_at(ident, 1)["value"].cast("string").alias("output_id"),
            )
        )
    if not frames:
        return spark.createDataFrame(
            [], "agent string, topic string, key string, value string, output_id string"
        )
    outputs_df = frames[0]
    for frame in frames[1:]:
        outputs_df = outputs_df.unionByName(frame)
    routes = spark.createDataFrame(
        [(b.name, b.input, b.output) for b in app.agents if b.output],
        "agent string, input string, topic string",
    )
    return duplicate_outputs(journal, outputs_df, routes, legacy_topic=app.input_topics[0])


def _journal_figures(
    journal: DataFrame, states: DataFrame, records: int, now_ms: int, stuck_after_ms: int
) -> dict[str, int]:
    """:func:`~agents_stream.spark.frames.journal_audit.merge_audit`'s figures, in Spark."""
    # Two Spark jobs for every figure (not one per figure): each job costs more than the
    # aggregation itself on a cached journal.
    is_call = F.col("kind") == "call"

    def where(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0))

    def status(name: str) -> Any:
        return where(is_call & (F.col("status") == name)).alias(name)

    two_phase = (F.col("kind") == "two_phase") & F.col("phase").isin(*OPEN_PHASES)
    j = journal.agg(
        where(two_phase).alias("two_phase_waiting"),
        # the rows of tables["stuck_two_phase"]
        where(two_phase & (F.col("started_ms") < F.lit(now_ms - stuck_after_ms))).alias(
            "stuck_two_phase"
        ),
        status("SUCCEEDED"),
        status("FAILED"),
        status("PENDING"),
        # the rows of tables["stuck"] (journal_tables), counted
        where(
            is_call
            & (F.col("status") == "PENDING")
            & (F.col("started_ms") < F.lit(now_ms - stuck_after_ms))
        ).alias("stuck"),
        *(where(F.col("kind") == k).alias(k) for k in ("truncation", "undecodable", "memory")),
    ).collect()[0]
    s = states.agg(
        F.count("*").alias("states"),
        where(F.col("completed")).alias("completed"),
        where(~F.col("completed")).alias("in_flight"),  # the rows of tables["in_flight"]
    ).collect()[0]
    return {
        "journal_records": records,
        "action_states": s["states"],
        "completed_action_states": s["completed"] or 0,
        "in_flight_action_states": s["in_flight"] or 0,
        "calls_succeeded": j["SUCCEEDED"] or 0,
        "calls_failed": j["FAILED"] or 0,
        "calls_pending": j["PENDING"] or 0,
        "stuck_calls": j["stuck"] or 0,
        "two_phase_waiting": j["two_phase_waiting"] or 0,
        "stuck_two_phase_calls": j["stuck_two_phase"] or 0,
        "truncations": j["truncation"] or 0,
        "undecodable_records": j["undecodable"] or 0,
        "memory_snapshots": j["memory"] or 0,
    }


def _summary(
    app: App,
    figures: Mapping[str, int],
    tables: Mapping[str, DataFrame],
    now_ms: int,
    stuck_after_s: float,
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "app": app.id,
        "action_state_topic": app.action_state_topic,
        "audited_at_ms": now_ms,
    }
    for name, value in figures.items():
        if name == "stuck_calls":
            summary["stuck_after_s"] = stuck_after_s
        summary[name] = value
    if "missing_inputs" in tables:
        missing = {
            (r["committed"], r["state"]): r["count"]
            for r in tables["missing_inputs"].groupBy("committed", "state").count().collect()
        }
        summary["inputs_missing_state"] = sum(missing.values())
        summary["inputs_missing_state_uncommitted"] = sum(
            n for (committed, _), n in missing.items() if not committed
        )
    if "duplicate_outputs" in tables:
        dups = tables["duplicate_outputs"].agg(
            F.count("*").alias("groups"), F.sum("duplicates").alias("records")
        )
        row = dups.collect()[0]
        summary["duplicate_output_groups"] = row["groups"]
        summary["duplicate_output_records"] = row["records"] or 0
    return summary


_COLUMNS = {
    "status_counts": ["action_name", "status", "count"],
    "in_flight": ["partition", "key", "seq", "action", "pending_calls", "failed_calls", "calls"],
    "stuck": ["partition", "key", "seq", "action", "index", "call_id", "age_s", "worker_id"],
    "stuck_two_phase": [
        "partition",
        "key",
        "seq",
        "action",
        "index",
        "phase",
        "age_s",
        "attempts",
        "last_error",
    ],
    "failures": ["exception_type", "calls", "functions", "example_message"],
    "truncations": [
        "key",
        "seq",
        "action",
        "index",
        "expected_function_id",
        "recorded_function_id",
        "dropped",
    ],
    "undecodable": ["partition", "offset", "key", "seq", "action", "index", "error"],
    "missing_inputs": ["agent", "topic", "partition", "offset", "key", "state", "committed"],
    "duplicate_outputs": [
        "agent",
        "key",
        "value",
        "records",
        "identified",
        "expected",
        "duplicates",
    ],
}


_REPORT_ROWS = 1000


def _write_parquet(table: pa.Table, path: Path) -> None:
    """What ``DataFrame.write.mode("overwrite").parquet`` leaves for a small table: the
    directory replaced by one part file and a ``_SUCCESS`` marker."""
    import pyarrow.parquet as pq

    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    pq.write_table(table, path / "part-00000.snappy.parquet", compression="snappy")
    (path / "_SUCCESS").touch()


def _write(result: AuditResult, out_dir: Path, app: App) -> None:
    """Writes the tables (those the driver computed from the driver, whole) and reports."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sections: list[report.Section] = []
    tables = result.tables
    for name in tables:
        # At most one Spark job per table: the first rows the report shows are the whole
        # table in the common case, and the driver writes them (out_dir is local: the
        # reports are written there too). A larger table is written by Spark.
        computed = tables.arrow(name) if isinstance(tables, AuditTables) else None
        if computed is not None:
            head = computed
            _write_parquet(head, out_dir / name)
        else:
            table = tables[name]
            head = table.limit(_REPORT_ROWS + 1).toArrow()
            if head.num_rows <= _REPORT_ROWS:
                _write_parquet(head, out_dir / name)
            else:
                table.write.mode("overwrite").parquet(str(out_dir / name))
        head = head.slice(0, _REPORT_ROWS)
        sections.append((name.replace("_", " "), head.to_pylist(), _COLUMNS[name]))
    result.out_dir = out_dir
    (out_dir / "summary.json").write_text(json.dumps(result.summary, indent=2))
    status_rows = sections[0][1]
    chart = report.svg_bar_chart(
        "Calls by action and status",
        [(f"{r['action_name']} {r['status']}", r["count"]) for r in status_rows],
    )
    (out_dir / "calls_by_status.svg").write_text(chart)
    title = f"agents_stream audit of {app.id}"
    md = report.render_markdown(title, result.summary, sections, "calls_by_status.svg")
    page = report.render_html(title, result.summary, sections, [chart])
    (out_dir / "report.md").write_text(md)
    (out_dir / "report.html").write_text(page)
    result.reports = [out_dir / "report.md", out_dir / "report.html"]
    log.info("audit: reports written to %s", out_dir)
