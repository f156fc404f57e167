"""``spark backfill``: run an agent over a range of its input topic on Spark executors.

Durable semantics are the worker's (see :mod:`.backfill_task`): each task owns one Kafka
partition, builds an in-memory ActionState store from a snapshot of that partition of
the ActionState topic (read once, compaction applied), skips completed actions, replays
journaled calls and executes the rest, in offset order.

Steps:

1. Plan and read the input range (``agents_stream.kafka`` source).
2. Read the ActionState snapshot (skipped when the topic does not exist yet or
   ``use_journal=False``).
3. Co-group both by partition and run :func:`.backfill_task.run_partition` per
   partition (``cogroup().applyInPandas``); the per-record results are cached.
4. Write every output (replayed and new, in input order per partition) to Parquet
   (``key, value, partition, input_offset, output_index``) and/or to an output topic
   (keyed like the worker's output, so the same partitioner places it).

The agent's own output topic is not just another topic: the worker's journal says which
outputs are in it (emitted markers) and the outputs carry their identity in a header. A
backfill into it sends only the outputs not there yet, each with the header the worker
would give it, and with ``write_journal`` marks their ActionDones emitted once they are
acked. Otherwise the ActionDones it journals stay unmarked, and the worker that later
consumes those inputs sends their outputs to the topic, once (guarantee 4 across
hosts): a backfill whose outputs went to Parquet or another topic never keeps them
from the agent's topic.

Guarantees and limits: outputs are those the worker would produce for the same inputs
and the same journal. Functions run on executors, so side effects happen there; with
``write_journal`` the new journal entries are appended to the ActionState topic after
each partition finishes, so a Spark task retry (or a later worker) re-executes only
calls whose task died before that write. Never run a backfill with ``write_journal``
while workers own the same partitions: both would journal the same slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from ...app import App
from ...errors import ConfigurationError
from ...host.output_log import OutputLog
from ...kafka.admin import TopicAdmin, compacted
from ...kafka.config import delivery_timeout_ms, producer_config
from ...serde.journal import default_journal_codec
from ..frames.action_state import compact
from ..shipping import make_importable
from ..source.datasource import read_kafka
from .backfill_task import (
    RESULT_DDL,
    BackfillTask,
    InputRecord,
    emit_rows,
    produce_outputs,
    run_partition,
)
from .common import committed_offsets, log, partition_counts, require_topics, step
from .progress import planned_records

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from ..source.options import OffsetSpec


@dataclass
class BackfillResult:
    """Totals of a backfill and the per-record results (a cached DataFrame)."""

    summary: dict[str, Any]
    records: DataFrame
    outputs: DataFrame
    written: list[str] = field(default_factory=list)


def pick_binding(app: App, agent: str | None) -> int:
    """Index of the binding of agent class ``agent`` (or the app's only agent)."""
    if agent is None:
        if len(app.agents) != 1:
            names = [b.name for b in app.agents]
            raise ConfigurationError(f"app {app.id!r} has agents {names}: pass --agent")
        return 0
    for i, binding in enumerate(app.agents):
        if binding.name == agent:
            return i
    raise ConfigurationError(f"app {app.id!r} has no agent named {agent!r}")


def run_backfill(
    spark: SparkSession,
    app: App,
    bootstrap: str,
    *,
    agent: str | None = None,
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    output_path: str | Path | None = None,
    output_topic: str | None = None,
    app_id: str | None = None,
    use_journal: bool = True,
    write_journal: bool = False,
    rerun_completed: bool = False,
    concurrency: int = 64,
) -> BackfillResult:
    """Backfills ``agent`` over its input topic range (steps in the module docstring).

    Args:
        spark: the session.
        app: the app (pickled to executors; they import the agent's module).
        bootstrap: bootstrap servers.
        agent: agent class name; required when the app has several.
        starting, ending: the input range, as for :func:`~agents_stream.spark.read_kafka`.
        output_path: write outputs as Parquet there.
        output_topic: produce outputs to this topic (default partitioner on the key, as
            the worker does). The agent's own output topic gets only the outputs not in
            it yet, with identity headers, marked emitted with ``write_journal``.
        app_id: journal under another app id (a separate ActionState topic and call ids),
            e.g. to re-run history without touching production's journal.
        use_journal: start from the ActionState snapshot; ``False`` executes everything.
        write_journal: append new journal entries to the ActionState topic.
        rerun_completed: also run inputs the worker group finished (below the
            partition's InputProgress marker or, without one, the group's committed
            offset). Off by default: those inputs are done, and running them again
            charges every side effect once more. They are counted in the summary as
            ``inputs_completed`` (and in ``skipped``).
        concurrency: records of distinct keys each task (input partition) runs at once,
            a key's records still in offset order, as the worker does; 1 runs them one
            at a time. With calls that take ``t`` seconds a task finishes at most
            ``concurrency / t`` records a second.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1; got {concurrency}")
    index = pick_binding(app, agent)
    binding = app.agents[index]
    require_topics(bootstrap, {binding.input: f"the input of agent {binding.name}"})
    make_importable(spark.sparkContext, app)  # a cluster's executors import the app
    if app.exactly_once:
        log.warning(
            "backfill of exactly-once app %s: journaled calls are never executed twice, "
            "but the outputs the job writes are at-least-once (a retried Spark task "
            "writes its partition's outputs again); downstream readers deduplicate them "
            "by their x-agents-stream-output header",
            app.id,
        )
    app_id = app_id or app.id
    state_topic = f"{app_id}-action-state"
    committed: tuple[tuple[int, int], ...] = ()
    if rerun_completed:
        log.warning(
            "backfill: --rerun-completed: inputs of %s the worker group already finished "
            "run AGAIN; their side effects are charged once more",
            binding.input,
        )
    elif use_journal and app_id == app.id:
        # Another app id is a separate history (its own journal and call ids): the
        # production group's offsets say nothing about what ran under it.
        counts = partition_counts(bootstrap, [binding.input])
        group = committed_offsets(bootstrap, app.id, binding.input, counts.get(binding.input, 0))
        committed = tuple(sorted(group.items()))
    emits = output_topic is not None and output_topic == binding.output
    if emits and not write_journal:
        log.warning(
            "backfill: outputs go to %s, the agent's own topic, without --write-journal: "
            "a worker that consumes the same inputs runs their actions and sends them again",
            output_topic,
        )
    elif emits and app_id != app.id:
        log.warning(
            "backfill: outputs journaled under app id %r go to %s, the topic of app %r: its "
            "workers keep their own history and send their own outputs for these inputs",
            app_id,
            output_topic,
            app.id,
        )
    if write_journal:
        _ensure_state_topic(app, bootstrap, state_topic)
    task = BackfillTask(
        app,
        index,
        app_id,
        state_topic,
        bootstrap,
        write_journal,
        rerun_completed,
        committed,
        emits=emits,
        concurrency=concurrency,
    )
    # An exactly-once app's aborted transactions (outputs, ActionDones) never happened:
    # read what its workers read.
    isolation = {"kafka.isolation.level": "read_committed"} if app.exactly_once else {}
    inputs = read_kafka(
        spark, bootstrap, binding.input, starting, ending, includeHeaders="false", **isolation
    ).select(
        "partition",
        "offset",
        F.col("key").cast("string").alias("key"),
        "value",
        F.unix_millis("timestamp").alias("timestamp_ms"),
    )
    state = _snapshot(spark, bootstrap, state_topic, use_journal, isolation)

    def run(pdf_in: pd.DataFrame, pdf_state: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        if pdf_in.empty:
            return pd.DataFrame(columns=[c.split()[0] for c in RESULT_DDL.split(", ")])
        partition = int(pdf_in["partition"].iloc[0])
        records = [
            InputRecord(
                partition, int(o), k if isinstance(k, str) else "", v,
                None if t is None else int(t), keyless=not isinstance(k, str),
            )
            for o, k, v, t in zip(
                pdf_in["offset"], pdf_in["key"], pdf_in["value"], pdf_in["timestamp_ms"],
                strict=True,
            )
        ]  # fmt: skip
        snapshot = list(zip(pdf_state["key"], pdf_state["value"], pdf_state["offset"], strict=True))
        return pd.DataFrame(run_partition(task, partition, records, snapshot))

    # Planned at the isolation level of the reads, so the total is what they read.
    planned = planned_records(
        bootstrap, [binding.input], starting=starting, ending=ending, **isolation
    )
    if use_journal and planned is not None:
        planned += planned_records(bootstrap, [state_topic], **isolation) or 0
    with step(spark, "backfill", f"run {binding.name} over {binding.input}", records=planned):
        results = (
            inputs.groupBy("partition")
            .cogroup(state.groupBy("partition"))
            .applyInPandas(run, RESULT_DDL)
        ).cache()
        totals = results.agg(
            F.count("*").alias("records"),
            F.sum(F.size("outputs")).alias("outputs"),
            F.sum(F.size("sends")).alias("outputs_unsent"),
            F.sum("actions_run").alias("actions_run"),
            F.sum("actions_skipped").alias("actions_skipped"),
            F.sum("calls_executed").alias("calls_executed"),
            F.sum("calls_replayed").alias("calls_replayed"),
            F.count("error").alias("errors"),
            F.sum(F.col("completed").cast("int")).alias("inputs_completed"),
        ).collect()[0]
    summary: dict[str, Any] = {k: int(v or 0) for k, v in totals.asDict().items()}
    summary["skipped"] = summary["inputs_completed"]
    summary.update(agent=binding.name, input=binding.input, app_id=app_id)
    log.info("backfill: %s", summary)
    # Each output with its identity (the worker's x-agents-stream-output value): a
    # consumer of another topic, or of the Parquet, can tell a re-run's copy from a new one.
    outputs = results.select(
        "key",
        "partition",
        "input_offset",
        F.posexplode(F.arrays_zip("outputs", "output_ids")).alias("output_index", "out"),
    ).select(
        "key",
        "partition",
        "input_offset",
        "output_index",
        F.col("out.outputs").alias("value"),
        F.col("out.output_ids").alias("output_id"),
    )
    result = BackfillResult(summary, results, outputs)
    if output_path is not None:
        with step(spark, "backfill", f"write outputs to {output_path}", records=summary["outputs"]):
            outputs.write.mode("overwrite").parquet(str(output_path))
            result.written.append(str(output_path))
    if output_topic is not None and emits:
        with step(
            spark,
            "backfill",
            f"send outputs not in {output_topic} yet",
            records=summary["outputs_unsent"],
        ):
            _emit(results, app, app_id, bootstrap, output_topic, state_topic, write_journal)
            result.written.append(output_topic)
    elif output_topic is not None:
        with step(
            spark, "backfill", f"produce outputs to {output_topic}", records=summary["outputs"]
        ):
            _produce(outputs, bootstrap, output_topic)
            result.written.append(output_topic)
    return result


def _ensure_state_topic(app: App, bootstrap: str, topic: str) -> None:
    """Creates the ActionState topic as the worker would (compacted, as many partitions
    as the app's largest input): written to first by a backfill, an auto-created topic
    would not be compacted, and the worker would refuse it."""
    admin = TopicAdmin(bootstrap)
    counts = admin.partition_counts(app.input_topics)
    partitions = max([counts.get(b.input, 0) for b in app.agents] + [1])
    admin.ensure([compacted(topic, partitions, app.replication_factor, app.min_insync_replicas)])


def _snapshot(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    use_journal: bool,
    isolation: dict[str, str] | None = None,
) -> DataFrame:
    empty = spark.createDataFrame([], "partition int, key binary, value binary, offset long")
    if not use_journal:
        return empty
    if topic not in partition_counts(bootstrap, [topic]):
        log.info("backfill: %s does not exist; starting from an empty journal", topic)
        return empty
    raw = read_kafka(spark, bootstrap, topic, includeHeaders="false", **(isolation or {}))
    return compact(raw).select("partition", "key", "value", "offset")


def _produce(outputs: DataFrame, bootstrap: str, topic: str) -> None:
    conf = producer_config(bootstrap)

    def send(rows: Any) -> None:
        produce_outputs(
            conf,
            topic,
            (
                (r["key"], r["value"], r["output_id"]) if r["output_id"] else (r["key"], r["value"])
                for r in rows
            ),
        )

    # One task per input partition, in input order: per-key output order is kept.
    outputs.repartition("partition").sortWithinPartitions(
        "partition", "input_offset", "output_index"
    ).foreachPartition(send)


def _emit(
    results: DataFrame,
    app: App,
    app_id: str,
    bootstrap: str,
    topic: str,
    state_topic: str,
    write_journal: bool,
) -> None:
    conf = producer_config(bootstrap)
    window_s, registry = app.output_scan_window, app.schema_registry_url
    delivery_timeout = delivery_timeout_ms(conf)

    def send(rows: Any) -> None:
        from pyspark import TaskContext

        already, codec = None, None
        context = TaskContext.get()
        if context is not None and context.attemptNumber() > 0 and window_s > 0:
            # A retried attempt: its predecessor may have sent some of these outputs.
            already = OutputLog(
                bootstrap, topic, app_id, window_s=window_s, delivery_timeout=delivery_timeout
            )
            codec = default_journal_codec(registry, state_topic)
        try:
            emit_rows(
                conf,
                topic,
                rows,
                bootstrap=bootstrap,
                state_topic=state_topic if write_journal else None,
                already=already,
                codec=codec,
            )
        finally:
            if already is not None:
                already.close()

    wanted = results.where(F.size("sends") + F.size("mark_keys") > 0).select(
        "partition", "input_offset", "key", "sends", "send_ids", "mark_keys", "mark_values"
    )
    wanted.repartition("partition").sortWithinPartitions(
        "partition", "input_offset"
    ).foreachPartition(send)
