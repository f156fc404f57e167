"""``agents_stream.kafka``: a PySpark batch data source over Kafka topics.

It produces exactly the columns of Spark's own Kafka source (the ``spark-sql-kafka``
connector), so a job written against it runs unchanged with ``format("kafka")`` once
that jar is on the classpath. With ``includeHeaders=true`` (default false, as in Spark)
the ``headers`` column is added::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>

Supported options (Spark's names and formats):

- ``kafka.bootstrap.servers`` (required) and any other ``kafka.*`` setting, passed to
  librdkafka without the prefix; the Java client's names Spark users write are translated
  where librdkafka has the same setting (``kafka.fetch.max.wait.ms`` ->
  ``fetch.wait.max.ms``, a PLAIN/SCRAM ``kafka.sasl.jaas.config`` -> ``sasl.username`` /
  ``sasl.password``...) and refused, naming librdkafka's, where it has not
  (:mod:`.client_names`; the table in docs/reference.md).
- exactly one of ``assign`` (JSON such as ``{"topicA":[0,1],"topicB":[2,4]}``),
  ``subscribe`` (comma-separated topics) or ``subscribePattern`` (a regular expression
  found anywhere in the name, as Java's ``find``; internal topics left out).
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON such as
  ``{"topic":{"0":23,"1":-2}}`` (-2 earliest, -1 latest; ending offsets are exclusive).
  As in Spark, a JSON value must name every partition read.
- ``startingTimestamp`` / ``startingOffsetsByTimestamp`` / ``endingTimestamp`` /
  ``endingOffsetsByTimestamp`` (milliseconds; precedence as in Spark) and
  ``startingOffsetsByTimestampStrategy`` (``error`` or ``latest``): Apache Kafka only.
- ``maxRecordsPerPartition``: split larger ranges into several Spark input partitions;
  ``minPartitions``: with fewer ranges than this, split them in proportion to their size.
- ``failOnDataLoss`` (default true; false reads what is there when offsets were deleted
  or an end lies past the partition's end), ``kafkaConsumer.pollTimeoutMs`` (default
  120000), ``includeHeaders`` (default false), ``groupIdPrefix``.

Any other option is an error that lists the valid ones; Spark's options this source does
not implement (``fetchOffset.*``, streaming triggers) are refused by name, with the
reason, rather than ignored, so a job never reads another range than it would with
``format("kafka")``.

Ends are resolved when Spark plans the query (see :mod:`agents_stream.spark.source.offsets`);
each action (``count()``, ``collect()``...) plans again, so "latest" means latest at that
action. Readers never join a consumer group and never commit offsets. Isolation level is
``read_uncommitted`` like Spark's source; with ``kafka.isolation.level=read_committed``
"latest" is the last stable offset, so a read never waits on an open transaction.

The pieces are reusable without Spark: :func:`~agents_stream.spark.source.plan_ranges`
lists the planned ``(topic, partition, start, end)`` ranges and
:func:`~agents_stream.spark.source.read_range` reads one of them into Arrow batches, e.g.
for audit, backfill or reconcile jobs over the ActionState topic that track their own
progress per range.

Example::

    spark.dataSource.register(KafkaDataSource)
    df = read_kafka(spark, "localhost:9092", ["orders"], maxRecordsPerPartition=100_000)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .errors import KafkaSourceError
from .offsets import OffsetRange, plan_offset_ranges
from .options import KafkaSourceOptions, OffsetSpec, source_options

__all__ = [
    "KAFKA_SCHEMA",
    "SOURCE_NAME",
    "KafkaDataSource",
    "KafkaRangePartition",
    "KafkaRangeReader",
    "read_kafka",
    "source_options",
]

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "agents_stream.kafka"

HEADERS_FIELD = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        HEADERS_FIELD,
    ]
)
"""The schema of Spark's Kafka source with ``includeHeaders=true``."""


@dataclass(frozen=True)
class KafkaRangePartition(InputPartition):
    """One Spark input partition: a single planned offset range."""

    range: OffsetRange


class KafkaDataSource(DataSource):
    """Batch-only Python data source registered as ``agents_stream.kafka``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        options = KafkaSourceOptions.from_options(self.options)
        if options.include_headers:
            return KAFKA_SCHEMA
        return StructType([f for f in KAFKA_SCHEMA.fields if f.name != "headers"])

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaRangeReader(KafkaSourceOptions.from_options(self.options))


class KafkaRangeReader(DataSourceReader):
    """Plans ranges on the driver and reads each one in an executor's Python worker."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [KafkaRangePartition(r) for r in plan_offset_ranges(self.options)]

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        # Imported here: this module is loaded on the driver for planning too, and the
        # reader pulls in pyarrow only where records are actually read.
        from .record_reader import read_range

        rng = planned_range(partition)
        if rng is None:
            return iter(())
        return read_range(
            self.options.consumer_conf("reader"),
            rng,
            include_headers=self.options.include_headers,
            batch_size=self.options.batch_size,
            poll_timeout_s=self.options.poll_timeout_ms / 1000,
            fail_on_data_loss=self.options.fail_on_data_loss,
        )


def planned_range(partition: InputPartition | None) -> OffsetRange | None:
    """The range of an input partition; ``None`` for the single call PySpark makes with a
    bare ``InputPartition(None)`` when planning found none (a pattern matching no topic:
    0 rows, as in Spark)."""
    if isinstance(partition, KafkaRangePartition):
        return partition.range
    if partition is None or getattr(partition, "value", 0) is None:
        return None
    raise KafkaSourceError(
        f"expected an input partition planned by this source, got {type(partition).__name__}"
    )


def read_kafka(
    spark: SparkSession,
    bootstrap: str,
    topics: str | Sequence[str],
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    *,
    source: str = SOURCE_NAME,
    **options: Any,
) -> DataFrame:
    """Reads a range of Kafka topics as a DataFrame with Spark's Kafka source columns.

    Options are validated here, in the caller's process, so mistakes raise a typed
    :class:`~agents_stream.spark.source.errors.KafkaSourceOptionError` instead of a Java
    exception at the first action.

    Args:
        spark: a session with :class:`KafkaDataSource` registered
            (:func:`agents_stream.spark.get_spark` does it for agents_stream jobs).
        bootstrap: ``host:port[,host:port]`` of the cluster.
        topics: topic names (a list or a comma-separated string).
        starting: ``"earliest"``, or per-partition offsets as a mapping or Spark JSON.
        ending: ``"latest"`` (resolved at each action), or per-partition offsets
            (exclusive).
        source: the format name; ``"kafka"`` uses Spark's connector jar instead.
        **options: further source options, e.g. ``maxRecordsPerPartition=50_000`` or
            ``**{"kafka.security.protocol": "SSL"}``.

    Returns:
        A lazily evaluated DataFrame; each action plans and reads the ranges again.
    """
    opts = source_options(bootstrap, topics, starting=starting, ending=ending, **options)
    if source == SOURCE_NAME:
        KafkaSourceOptions.from_options(opts)
    return spark.read.format(source).options(**opts).load()
