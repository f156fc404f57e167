"""A generic Kafka batch data source for PySpark, registered as ``agents_stream.kafka``.

This package knows Kafka and PySpark, nothing of agents_stream apps: it imports none of
the app, the durable core, serde, state or runtime (``tests/spark/test_source_standalone.py``
checks it), so any PySpark 4 job can read Kafka topics with it, with the columns and
option names of Spark's own ``format("kafka")`` and without the connector jar::

    from pyspark.sql import SparkSession
    from agents_stream.spark.source import KafkaDataSource

    spark = SparkSession.builder.getOrCreate()
    spark.dataSource.register(KafkaDataSource)
    orders = (
        spark.read.format("agents_stream.kafka")
        .option("kafka.bootstrap.servers", "localhost:9092")
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .load()
    )

:func:`read_kafka` is the same read with the options validated in the caller's process
(typed :class:`KafkaSourceOptionError` instead of a Java stack trace). The executors'
Python workers import this package too, so the cluster needs ``agents-stream[spark]``
installed where the workers run. Importing it still runs ``agents_stream/__init__``,
which loads the package's public API; the source depends on none of it.

Without Spark, :func:`plan_ranges` lists the ``(topic, partition, start, end)`` ranges a
read covers and :func:`read_range` reads one of them into Arrow batches.

Modules: :mod:`.datasource` (the PySpark ``DataSource``), :mod:`.options` (option
parsing), :mod:`.offsets` (planning on the driver), :mod:`.record_reader` (reading one
range on an executor), :mod:`.errors`. Names below resolve on first use, so planning and
options work without PySpark installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_namespace

if TYPE_CHECKING:
    from .datasource import KAFKA_SCHEMA, SOURCE_NAME, KafkaDataSource, read_kafka
    from .errors import KafkaSourceError, KafkaSourceOptionError
    from .offsets import OffsetRange, plan_offset_ranges, plan_ranges
    from .options import KafkaSourceOptions, OffsetSpec, source_options
    from .record_reader import arrow_schema, read_range

_EXPORTS = {
    "KAFKA_SCHEMA": "datasource",
    "SOURCE_NAME": "datasource",
    "KafkaDataSource": "datasource",
    "read_kafka": "datasource",
    "KafkaSourceError": "errors",
    "KafkaSourceOptionError": "errors",
    "OffsetRange": "offsets",
    "plan_offset_ranges": "offsets",
    "plan_ranges": "offsets",
    "KafkaSourceOptions": "options",
    "OffsetSpec": "options",
    "source_options": "options",
    "arrow_schema": "record_reader",
    "read_range": "record_reader",
}

__all__ = [
    "KAFKA_SCHEMA",
    "SOURCE_NAME",
    "KafkaDataSource",
    "KafkaSourceError",
    "KafkaSourceOptionError",
    "KafkaSourceOptions",
    "OffsetRange",
    "OffsetSpec",
    "arrow_schema",
    "plan_offset_ranges",
    "plan_ranges",
    "read_kafka",
    "read_range",
    "source_options",
]


__getattr__, __dir__ = lazy_namespace(
    __name__, globals(), {name: f".{home}" for name, home in _EXPORTS.items()}, __all__
)
