"""Offset planning and range reading without Spark: options, splits, fetch-based ends."""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pytest

from agents_stream.spark import (
    KafkaSourceError,
    KafkaSourceOptionError,
    KafkaSourceOptions,
    OffsetRange,
    plan_offset_ranges,
    plan_ranges,
    read_range,
    source_options,
)
from agents_stream.spark.source.options import parse_offset_spec


def test_split_is_balanced_and_contiguous() -> None:
    pieces = OffsetRange("t", 0, 10, 110).split(30)
    assert [p.size for p in pieces] == [25, 25, 25, 25]
    assert pieces[0].start == 10 and pieces[-1].end == 110
    assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
    assert OffsetRange("t", 0, 5, 5).split(3) == [OffsetRange("t", 0, 5, 5)]


def test_parse_offset_spec_follows_spark() -> None:
    assert parse_offset_spec("EARLIEST", option="startingOffsets") == "earliest"
    assert parse_offset_spec('{"t":{"0":23,"1":-2}}', option="startingOffsets") == {
        "t": {0: 23, 1: -2}
    }
    for option, value in [
        ("startingOffsets", "latest"),
        ("startingOffsets", '{"t":{"0":-1}}'),
        ("endingOffsets", "earliest"),
        ("endingOffsets", '{"t":{"0":-2}}'),
        ("endingOffsets", "{not json"),
        ("endingOffsets", '{"t":{"0":-3}}'),
    ]:
        with pytest.raises(KafkaSourceOptionError, match=option):
            parse_offset_spec(value, option=option)


def test_options_require_servers_and_one_subscription() -> None:
    with pytest.raises(KafkaSourceOptionError, match="bootstrap"):
        KafkaSourceOptions.from_options({"subscribe": "t"})
    with pytest.raises(KafkaSourceOptionError, match="subscribe"):
        KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1"})
    with pytest.raises(KafkaSourceOptionError, match=r"enable\.auto\.commit"):
        KafkaSourceOptions.from_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.enable.auto.commit": "true"}
        )
    opts = KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "a, b", "kafka.client.id": "me"}
    )
    assert opts.topics == ("a", "b")
    conf = opts.consumer_conf("reader")
    assert conf["client.id"] == "me" and conf["enable.auto.commit"] is False


@pytest.mark.broker
def test_plan_uses_fetched_end_and_reads_exactly(broker, kafka_topic, produce) -> None:
    topic = kafka_topic(2)
    produce(topic, [(0, None, b"%d" % i, None, None) for i in range(40)])
    opts = KafkaSourceOptions.from_options(
        source_options(broker.bootstrap, topic, maxRecordsPerPartition=15)
    )
    ranges = plan_offset_ranges(opts)
    assert ranges == [
        OffsetRange(topic, 0, 0, 14),
        OffsetRange(topic, 0, 14, 27),
        OffsetRange(topic, 0, 27, 40),
        OffsetRange(topic, 1, 0, 0),
    ]
    table = pa.Table.from_batches(
        [b for r in ranges for b in read_range(opts.consumer_conf("reader"), r, batch_size=7)],
        schema=None,
    )
    assert table.column("offset").to_pylist() == list(range(40))
    assert table.column("value").to_pylist() == [b"%d" % i for i in range(40)]


@pytest.mark.broker
def test_plan_rejects_impossible_ranges(broker, kafka_topic, produce) -> None:
    topic = kafka_topic(1)
    produce(topic, [(0, None, b"x", None, None)] * 5)

    def plan(**kw):
        return plan_offset_ranges(
            KafkaSourceOptions.from_options(source_options(broker.bootstrap, topic, **kw))
        )

    with pytest.raises(KafkaSourceError, match="beyond") as info:
        plan(ending={topic: {0: 6}})
    assert (info.value.topic, info.value.partition, info.value.offset) == (topic, 0, 6)
    with pytest.raises(KafkaSourceError, match="after ending"):
        plan(starting={topic: {0: 4}}, ending={topic: {0: 2}})
    with pytest.raises(KafkaSourceOptionError, match="not among"):
        plan(starting={topic: {3: 0}})
    with pytest.raises(KafkaSourceOptionError, match="does not exist"):
        plan_offset_ranges(
            KafkaSourceOptions.from_options(source_options(broker.bootstrap, topic + "-missing"))
        )


@pytest.mark.broker
def test_transaction_markers_at_the_end_do_not_stall_readers(broker, kafka_topic) -> None:
    from confluent_kafka import Producer

    topic = kafka_topic(1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=b"%d" % i, partition=0)
    producer.commit_transaction(30)
    # The commit marker takes an offset with no data record (on brokers that write one),
    # so the last offset of the range is never delivered: only EOF ends the read.
    (rng,) = plan_ranges(broker.bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": 5000})
    assert rng.end >= 5
    opts = KafkaSourceOptions.from_options(source_options(broker.bootstrap, topic))
    batches = list(read_range(opts.consumer_conf("reader"), rng, poll_timeout_s=5))
    assert [v for b in batches for v in b.column("value").to_pylist()] == [
        b"%d" % i for i in range(5)
    ]


def test_unknown_and_unsupported_options_list_the_valid_ones() -> None:
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    with pytest.raises(KafkaSourceOptionError, match=r"maxRecordPerPartition.*valid options"):
        KafkaSourceOptions.from_options({**base, "maxRecordPerPartition": "5"})
    with pytest.raises(KafkaSourceOptionError, match=r"maxOffsetsPerTrigger.*streaming"):
        KafkaSourceOptions.from_options({**base, "maxOffsetsPerTrigger": "1"})
    with pytest.raises(KafkaSourceOptionError, match="subscribe"):
        KafkaSourceOptions.from_options({**base, "assign": '{"t":[0]}'})
    for bad in ("[0]", '{"t":[]}', '{"t":["0"]}', "{}", "not json"):
        with pytest.raises(KafkaSourceOptionError, match="assign"):
            KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1", "assign": bad})
    opts = KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": "h:1", "assign": '{"a":[2,0],"b":[1]}', "minPartitions": "8"}
    )
    assert opts.assign == {"a": (0, 2), "b": (1,)} and opts.min_partitions == 8
    assert not opts.include_headers  # Spark's default


def test_min_partitions_splits_in_proportion_like_spark() -> None:
    from agents_stream.spark.source.offsets import _min_partitions

    ranges = [OffsetRange("t", 0, 0, 300), OffsetRange("t", 1, 0, 100), OffsetRange("t", 2, 5, 5)]
    out = _min_partitions(ranges, 8)
    assert [r for r in out if r.partition == 0] == [
        OffsetRange("t", 0, 0, 50),
        OffsetRange("t", 0, 50, 100),
        OffsetRange("t", 0, 100, 150),
        OffsetRange("t", 0, 150, 200),
        OffsetRange("t", 0, 200, 250),
        OffsetRange("t", 0, 250, 300),
    ]
    assert [r for r in out if r.partition == 1] == [
        OffsetRange("t", 1, 0, 50),
        OffsetRange("t", 1, 50, 100),
    ]
    assert OffsetRange("t", 2, 5, 5) in out
    assert _min_partitions(ranges, 3) == ranges  # already enough


@pytest.mark.broker
def test_assign_and_partial_json_offsets(broker, kafka_topic, produce) -> None:
    topic = kafka_topic(3)
    produce(topic, [(p, None, b"x", None, None) for p in range(3) for _ in range(4)])

    def plan(**kw):
        return plan_offset_ranges(
            KafkaSourceOptions.from_options(source_options(broker.bootstrap, "", **kw))
        )

    assigned = json.dumps({topic: [2, 0]})
    assert plan(assign=assigned) == [OffsetRange(topic, 0, 0, 4), OffsetRange(topic, 2, 0, 4)]
    assert plan(assign=assigned, starting={topic: {0: 1, 2: -2}})[0].start == 1
    with pytest.raises(KafkaSourceOptionError, match=r"must name every partition.*\[2\]"):
        plan(assign=assigned, starting={topic: {0: 1}})
    with pytest.raises(KafkaSourceOptionError, match="endingOffsets"):
        plan(subscribe=topic, ending={topic: {0: 2, 1: 2}})
    with pytest.raises(KafkaSourceOptionError, match="no partition 7"):
        plan(assign=json.dumps({topic: [7]}))
    assert len(plan(subscribe=topic, minPartitions=6)) == 6


@pytest.mark.broker
def test_spark_semantics_of_patterns_data_loss_and_open_transactions(broker, kafka_topic) -> None:
    """Without Spark: a pattern is found anywhere in the name; failOnDataLoss=false cuts an
    end past the partition's end; read_committed plans end at the last stable offset
    while a transaction is open; timestamps are refused on the embedded broker."""
    from confluent_kafka import Producer

    topic = kafka_topic(1)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        plain.produce(topic, value=b"%d" % i, partition=0)
    assert plain.flush(30) == 0
    tx = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic}-tx"})
    tx.init_transactions(30)
    tx.begin_transaction()
    for i in range(4):
        tx.produce(topic, value=b"open-%d" % i, partition=0)
    tx.flush(30)
    try:
        assert plan_ranges(broker.bootstrap, topic) == [OffsetRange(topic, 0, 0, 9)]
        committed = plan_ranges(
            broker.bootstrap, topic, **{"kafka.isolation.level": "read_committed"}
        )
        assert committed == [OffsetRange(topic, 0, 0, 5)]
        assert plan_ranges(broker.bootstrap, "", subscribePattern=f"{topic[3:]}$") == plan_ranges(
            broker.bootstrap, topic
        )
        assert plan_ranges(broker.bootstrap, "", subscribePattern=f"^{topic}-none") == []
        lenient = {"failOnDataLoss": False}
        assert plan_ranges(broker.bootstrap, topic, ending={topic: {0: 50}}, **lenient) == [
            OffsetRange(topic, 0, 0, 9)
        ]
        assert plan_ranges(
            broker.bootstrap, topic, starting={topic: {0: 40}}, ending={topic: {0: 50}}, **lenient
        ) == [OffsetRange(topic, 0, 9, 9)]
        with pytest.raises(KafkaSourceError, match="failOnDataLoss=false"):
            plan_ranges(broker.bootstrap, topic, starting={topic: {0: 40}})
        if broker.kind == "embedded":
            with pytest.raises(KafkaSourceOptionError, match=r"^startingTimestamp: the embedded"):
                plan_ranges(broker.bootstrap, topic, startingTimestamp=0)
    finally:
        tx.abort_transaction(30)
