"""Old import path of :mod:`agents_stream.spark.source.datasource`, kept for existing imports."""

from __future__ import annotations

from .source.datasource import (
    HEADERS_FIELD,
    KAFKA_SCHEMA,
    SOURCE_NAME,
    KafkaDataSource,
    KafkaRangePartition,
    KafkaRangeReader,
    read_kafka,
    source_options,
)

__all__ = [
    "HEADERS_FIELD",
    "KAFKA_SCHEMA",
    "SOURCE_NAME",
    "KafkaDataSource",
    "KafkaRangePartition",
    "KafkaRangeReader",
    "read_kafka",
    "source_options",
]
