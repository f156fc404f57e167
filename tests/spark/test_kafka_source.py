"""The agents_stream.kafka data source read through Spark against the real broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from agents_stream.spark import KafkaSourceError, KafkaSourceOptionError, read_kafka
from agents_stream.spark.source import KAFKA_SCHEMA, SOURCE_NAME, arrow_schema, source_options

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _fill(produce, topic: str, counts: dict[int, int]) -> None:
    produce(
        topic,
        [
            (p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), None, None)
            for p, n in counts.items()
            for i in range(n)
        ],
    )


def _offsets(df) -> set[tuple[int, int]]:
    return {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}


def test_schema_is_sparks_kafka_schema(spark, broker, kafka_topic) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    topic = kafka_topic(1)
    df = read_kafka(spark, broker.bootstrap, topic, includeHeaders=True)
    assert df.schema == KAFKA_SCHEMA
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    # Readers yield Arrow batches, which Spark accepts only with exactly its own layout.
    assert arrow_schema().equals(to_arrow_schema(KAFKA_SCHEMA, timezone="UTC"))
    no_headers = read_kafka(spark, broker.bootstrap, topic)  # Spark's default: false
    assert no_headers.columns == df.columns[:-1]


def test_exact_rows_and_offsets_over_partitions(spark, broker, kafka_topic, produce) -> None:
    topic = kafka_topic(3)
    counts = {0: 120, 1: 7, 2: 61}
    # Produced in one burst with linger, so each partition ends with a multi-record batch:
    # the end must come from a fetch, not from ListOffsets.
    _fill(produce, topic, counts)
    df = read_kafka(spark, broker.bootstrap, topic)
    assert df.count() == sum(counts.values())
    assert _offsets(df) == {(p, o) for p, n in counts.items() for o in range(n)}
    rows = df.where("partition = 2").orderBy("offset").collect()
    assert [(r.key, r.value, r.topic) for r in rows] == [
        (f"k2-{i}".encode(), f"v2-{i}".encode(), topic) for i in range(61)
    ]


def test_json_starting_and_ending_offsets(spark, broker, kafka_topic, produce) -> None:
    topic = kafka_topic(3)
    _fill(produce, topic, {0: 30, 1: 30, 2: 30})
    starting = json.dumps({topic: {"0": 5, "1": -2, "2": 29}})
    ending = {topic: {0: 20, 1: -1, 2: -1}}
    df = read_kafka(spark, broker.bootstrap, topic, starting=starting, ending=ending)
    assert _offsets(df) == (
        {(0, o) for o in range(5, 20)} | {(1, o) for o in range(30)} | {(2, 29)}
    )


def test_large_range_is_split_into_input_partitions(spark, broker, kafka_topic, produce) -> None:
    topic = kafka_topic(2)
    _fill(produce, topic, {0: 100, 1: 25})
    df = read_kafka(spark, broker.bootstrap, topic, maxRecordsPerPartition=30)
    assert df.rdd.getNumPartitions() == 4 + 1
    offsets = [(r.partition, r.offset) for r in df.select("partition", "offset").collect()]
    assert len(offsets) == len(set(offsets)) == 125
    assert set(offsets) == {(0, o) for o in range(100)} | {(1, o) for o in range(25)}


def test_keys_headers_and_timestamps_preserved(spark, broker, kafka_topic, produce) -> None:
    topic = kafka_topic(1)
    ts = 1_700_000_000_123
    headers = [("trace", b"abc"), ("trace", b"def"), ("empty", None), ("ü", b"\x00\xff")]
    produce(
        topic,
        [
            (0, None, b"no-key", None, ts),
            (0, b"\x00binary\xff", None, headers, ts + 1),
            (0, b"", b"", [], ts + 2),
        ],
    )
    rows = read_kafka(spark, broker.bootstrap, topic, includeHeaders=True)
    rows = rows.orderBy("offset").collect()
    assert [(r.key, r.value) for r in rows] == [
        (None, b"no-key"),
        (b"\x00binary\xff", None),
        (b"", b""),
    ]
    assert rows[0].headers is None
    assert [(h.key, h.value) for h in rows[1].headers] == headers
    # Spark's Kafka source also gives null (not an empty array) for no headers.
    assert rows[2].headers is None
    assert rows[1].timestamp.astimezone(UTC) == datetime.fromtimestamp((ts + 1) / 1000, UTC)
    assert {r.timestampType for r in rows} == {0}  # CreateTime


def test_empty_topic_and_empty_partition(spark, broker, kafka_topic, produce) -> None:
    empty = kafka_topic(2)
    assert read_kafka(spark, broker.bootstrap, empty).count() == 0
    partly = kafka_topic(3)
    _fill(produce, partly, {1: 4})
    df = read_kafka(spark, broker.bootstrap, [empty, partly])
    assert _offsets(df) == {(1, o) for o in range(4)}


def test_format_name_and_raw_options(spark, broker, kafka_topic, produce) -> None:
    topic = kafka_topic(1)
    _fill(produce, topic, {0: 3})
    opts = source_options(broker.bootstrap, topic)
    df = spark.read.format(SOURCE_NAME).options(**opts).load()
    assert df.count() == 3


def test_invalid_options_fail_before_spark_runs(spark, broker, kafka_topic) -> None:
    topic = kafka_topic(1)
    with pytest.raises(KafkaSourceOptionError, match="startingOffsets"):
        read_kafka(spark, broker.bootstrap, topic, starting="latest")
    with pytest.raises(KafkaSourceOptionError, match="maxRecordsPerPartition"):
        read_kafka(spark, broker.bootstrap, topic, maxRecordsPerPartition=0)


def test_ending_beyond_end_fails_at_planning(spark, broker, kafka_topic, produce) -> None:
    topic = kafka_topic(1)
    _fill(produce, topic, {0: 3})
    df = read_kafka(spark, broker.bootstrap, topic, ending={topic: {0: 50}})
    with pytest.raises(Exception, match="beyond the partition's end") as info:
        df.count()
    assert not isinstance(info.value, KafkaSourceError)  # surfaced by Spark, as text
