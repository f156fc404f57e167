"""Decoded ActionStates as Spark DataFrames, with Kafka compaction applied in Spark.

Reading is three steps, each a plain DataFrame transformation:

1. Read the ActionState topic with the ``agents_stream.kafka`` source (no consumer
   group, nothing committed).
2. :func:`compact`: keep the last record per ``(Kafka partition, Kafka key)`` by offset,
   then drop keys whose last record is a tombstone: what log compaction converges to,
   whether or not the broker has compacted yet.
3. Decode the live values on executors into journal rows
   (:mod:`agents_stream.spark.frames.journal_rows`), from any schema version, in Arrow
   batches.

:func:`read_journal` does all three in the partition readers of the
``agents_stream.journal`` source (:mod:`.journal_source`: one reader per Kafka partition
compacts it in memory and decodes it, no shuffle); with ``maxRecordsPerPartition`` or
``minPartitions`` (a partition split over readers) it reads with ``agents_stream.kafka``,
compacts with :func:`compact` and decodes with :func:`decode_journal` (``mapInArrow``).

:func:`read_journal` returns those flat rows (one per live record);
:func:`read_action_states` groups them into one row per ActionState
``(partition, key, seq, action)`` with its call slots nested, the completion record's
facts, and truncation evidence. Memory snapshots are per key, not per action: they are
in :func:`read_journal` only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from ...app import App
from ..session import register_once
from ..source.datasource import read_kafka
from ..source.options import KafkaSourceOptions, source_options
from .journal_rows import JOURNAL_DDL, decode_batches
from .journal_source import JOURNAL_SOURCE_NAME, JournalDataSource

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from ..source.options import OffsetSpec

__all__ = [
    "action_states",
    "compact",
    "decode_journal",
    "read_action_states",
    "read_audit_view",
    "read_journal",
    "splits_partitions",
]

CALL_FIELDS = (
    "index",
    "function_id",
    "args_digest",
    "status",
    "result_json",
    "result_size",
    "exception_type",
    "exception_message",
    "call_id",
    "started_ms",
    "finished_ms",
    "attempts",
    "worker_id",
)
TRUNCATION_FIELDS = (
    "index",
    "expected_function_id",
    "recorded_function_id",
    "expected_args_digest",
    "recorded_args_digest",
    "dropped",
    "at_ms",
)


def _target(app_or_topic: App | str, registry_url: str | None) -> tuple[str, str | None]:
    if isinstance(app_or_topic, App):
        return app_or_topic.action_state_topic, registry_url or app_or_topic.schema_registry_url
    return app_or_topic, registry_url


def compact(raw: DataFrame) -> DataFrame:
    """Last record per ``(partition, key)`` by offset; keys ending in a tombstone removed.

    Args:
        raw: Kafka source columns (at least key, value, partition, offset, timestamp).

    Returns:
        ``key, value, partition, offset, timestamp_ms`` of the live records.
    """
    last = raw.groupBy("partition", "key").agg(
        F.max_by(F.struct("offset", "value", "timestamp"), "offset").alias("r")
    )
    return last.where(F.col("r.value").isNotNull()).select(
        "key",
        F.col("r.value").alias("value"),
        "partition",
        F.col("r.offset").alias("offset"),
        F.unix_millis(F.col("r.timestamp")).alias("timestamp_ms"),
    )


def decode_journal(
    live: DataFrame,
    *,
    registry_url: str | None = None,
    topic: str | None = None,
    include_raw: bool = False,
) -> DataFrame:
    """Decodes live ActionState records (output of :func:`compact`) into journal rows."""

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return decode_batches(
            batches, registry_url=registry_url, topic=topic, include_raw=include_raw
        )

    return live.mapInArrow(decode, JOURNAL_DDL)


def read_journal(
    spark: SparkSession,
    bootstrap: str,
    app_or_topic: App | str,
    *,
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    registry_url: str | None = None,
    include_raw: bool = False,
    **options: Any,
) -> DataFrame:
    """Live, decoded ActionState records: one row per record left after compaction.

    Args:
        spark: a session with our sources registered (:func:`~agents_stream.spark.get_spark`).
        bootstrap: the cluster's bootstrap servers.
        app_or_topic: an :class:`~agents_stream.App` (its ``<id>-action-state`` topic and
            schema registry) or a topic name.
        starting, ending: offsets to read, as for :func:`~agents_stream.spark.read_kafka`;
            compaction is applied within the range read.
        registry_url: Schema Registry for Confluent-framed values (default: the app's).
        include_raw: keep the encoded value in ``raw_value`` (backfill, reconcile).
        **options: further ``agents_stream.kafka`` options, e.g.
            ``maxRecordsPerPartition``.

    Returns:
        Journal rows (see :data:`agents_stream.spark.frames.journal_rows.JOURNAL_COLUMNS`); the
        ``kind`` column is ``call``, ``done``, ``memory``, ``truncation``, ``progress``,
        ``two_phase`` (a two-phase obligation, v8) or ``undecodable``.
    """
    topic, registry = _target(app_or_topic, registry_url)
    if splits_partitions(options):
        # A Kafka partition split over several readers: compaction needs the shuffle.
        raw = read_kafka(
            spark, bootstrap, topic, starting, ending, includeHeaders="false", **options
        )
        return decode_journal(
            compact(raw), registry_url=registry, topic=topic, include_raw=include_raw
        )
    return _journal_source(
        spark, bootstrap, topic, registry, starting, ending, options, include_raw=include_raw
    )


def splits_partitions(options: Mapping[str, Any]) -> bool:
    """Whether read ``options`` split a Kafka partition over several readers
    (``maxRecordsPerPartition``, ``minPartitions``): compaction then needs a shuffle."""
    return bool({k.lower() for k in options} & {"maxrecordsperpartition", "minpartitions"})


def _journal_source(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    registry: str | None,
    starting: str | OffsetSpec,
    ending: str | OffsetSpec,
    options: Mapping[str, Any],
    *,
    include_raw: bool = False,
    view: str = "rows",
    view_row_limit: int | None = None,
) -> DataFrame:
    opts = source_options(bootstrap, topic, starting=starting, ending=ending, **options)
    KafkaSourceOptions.from_options(opts)  # mistakes raise here, typed, not in a Java trace
    if registry:
        opts["journal.registryUrl"] = registry
        opts["journal.topic"] = topic
    opts["journal.includeRaw"] = "true" if include_raw else "false"
    opts["journal.view"] = view
    if view_row_limit is not None:
        opts["journal.viewRowLimit"] = str(view_row_limit)
    register_once(spark, JournalDataSource)
    return spark.read.format(JOURNAL_SOURCE_NAME).options(**opts).load()


def read_audit_view(
    spark: SparkSession,
    bootstrap: str,
    app_or_topic: App | str,
    *,
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    registry_url: str | None = None,
    row_limit: int | None = None,
    **options: Any,
) -> DataFrame:
    """The audit's one-pass view of the ActionState topic: each partition's reader
    compacts and decodes it and yields its partial audit results
    (:mod:`~agents_stream.spark.frames.journal_audit`), not its rows. With ``row_limit``,
    a partition with more rows than that yields an ``overflow`` row instead.

    Raises:
        KafkaSourceOptionError: ``options`` split a partition over several readers
            (:func:`splits_partitions`); a reader must see its whole partition.
    """
    topic, registry = _target(app_or_topic, registry_url)
    return _journal_source(
        spark, bootstrap, topic, registry, starting, ending, options, view="audit",
        view_row_limit=row_limit,
    )  # fmt: skip


def read_check_view(
    spark: SparkSession,
    bootstrap: str,
    app_or_topic: App | str,
    *,
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    registry_url: str | None = None,
    **options: Any,
) -> DataFrame:
    """Journal rows with only the columns the audit's input and output checks use
    (:data:`~agents_stream.spark.frames.journal_rows.CHECK_COLUMNS`), each equal to
    :func:`read_journal`'s: the calls and completions are not decoded whole.

    Raises:
        KafkaSourceOptionError: ``options`` split a partition over several readers.
    """
    topic, registry = _target(app_or_topic, registry_url)
    return _journal_source(
        spark, bootstrap, topic, registry, starting, ending, options, view="checks"
    )


def action_states(journal: DataFrame) -> DataFrame:
    """Groups journal rows into one row per ActionState ``(partition, topic, key, seq,
    action)`` (``topic``: the input topic, ``""`` for entries written before v5).

    Columns: ``partition, topic, key, seq, action, action_name``; ``calls`` (array of structs
    ordered by index: index, function_id, args_digest, status, result_json, result_size,
    exception_type, exception_message, call_id, started_ms, finished_ms, attempts,
    worker_id); ``pending_calls``, ``failed_calls``, ``succeeded_calls``; ``completed``
    (an ActionDone exists), ``outputs_count``, ``outputs_json``, ``emitted``,
    ``emitted_outputs`` (indexes of outputs known sent when not all are), ``finished_ms``
    (of the ActionDone); ``truncations`` (array of structs) and
    ``truncated`` (any). Undecodable records are not grouped (see :func:`read_journal`).
    """
    rows = journal.where(F.col("kind").isin("call", "done", "truncation"))
    is_call, is_done = F.col("kind") == "call", F.col("kind") == "done"

    def count_status(status: str) -> Any:
        return F.sum(F.when(is_call & (F.col("status") == status), 1).otherwise(0))

    grouped = rows.groupBy("partition", "topic", "key", "seq", "action").agg(
        F.first("action_name").alias("action_name"),
        F.array_sort(F.collect_list(F.when(is_call, F.struct(*CALL_FIELDS)))).alias("calls"),
        count_status("PENDING").alias("pending_calls"),
        count_status("FAILED").alias("failed_calls"),
        count_status("SUCCEEDED").alias("succeeded_calls"),
        F.max(is_done).alias("completed"),
        F.max(F.when(is_done, F.col("outputs_count"))).alias("outputs_count"),
        F.first(F.when(is_done, F.col("outputs_json")), ignorenulls=True).alias("outputs_json"),
        F.max(F.when(is_done, F.col("emitted"))).alias("emitted"),
        F.first(F.when(is_done, F.col("emitted_outputs")), ignorenulls=True).alias(
            "emitted_outputs"
        ),
        F.max(F.when(is_done, F.col("finished_ms"))).alias("finished_ms"),
        F.array_sort(
            F.collect_list(F.when(F.col("kind") == "truncation", F.struct(*TRUNCATION_FIELDS)))
        ).alias("truncations"),
    )
    return grouped.withColumn("truncated", F.size("truncations") > 0)


def read_action_states(
    spark: SparkSession,
    bootstrap: str,
    app_or_topic: App | str,
    *,
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    registry_url: str | None = None,
    **options: Any,
) -> DataFrame:
    """Decoded ActionStates of an app: :func:`read_journal` grouped by :func:`action_states`.

    Example::

        states = read_action_states(get_spark(), "localhost:9092", app)
        states.where("not completed").select("key", "seq", "action", "calls").show()
    """
    journal = read_journal(
        spark,
        bootstrap,
        app_or_topic,
        starting=starting,
        ending=ending,
        registry_url=registry_url,
        **options,
    )
    return action_states(journal)
