"""Our readers read exactly what a plain confluent-kafka consumer reads, on Apache Kafka,
from topics with transactions: committed and aborted ones, interleaved with plain
records, so that offsets hold control records (commit and abort markers) no reader ever
sees and aborted records only ``read_uncommitted`` readers see.

Kafka only: the embedded broker shows aborted records to ``read_committed`` readers.

- the ``agents_stream.kafka`` Spark source (Spark's own default, ``read_uncommitted``,
  and ``kafka.isolation.level=read_committed``): the same (partition, offset, key, value)
  rows as the plain consumer at that isolation level, the planned ranges ending at the
  high watermark (past the last marker);
- the journal readers over an ActionState topic written in transactions: the Spark
  ``agents_stream.journal`` source and its shuffle path (``read_journal``), and the
  worker's cache rebuild (``state.recovery``): the live records (last value per key,
  tombstones applied) of the plain consumer at the same isolation level.

The official ``spark-sql-kafka-0-10`` connector is not cross-checked here: no build of
it for the installed PySpark (4.3.0) resolves from Maven Central (nor Spark 4.3.0's own
jars), so it cannot be put on the session's classpath.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    MemorySnapshot,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import default_journal_codec
from agents_stream.spark import read_kafka
from agents_stream.spark.frames.action_state import read_journal
from agents_stream.spark.source import plan_ranges
from agents_stream.state.cache import PartitionCache
from agents_stream.state.recovery import rebuild_partitions

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.kafka_only]

Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value
CODEC = default_journal_codec()


def plain_read(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[Row]:
    """Every record a plain consumer at ``isolation`` sees, to each partition's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"plain-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    rows: list[Row] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic} not read to its end"
            for msg in consumer.consume(500, 0.2):
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    at_end.add(msg.partition())
                    continue
                at_end.discard(msg.partition())
                rows.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return sorted(rows, key=lambda r: (r[0], r[1]))


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def live(rows: list[Row]) -> dict[tuple[int, bytes], tuple[int, bytes]]:
    """Compaction's view: (partition, key) -> (offset, value) of the last record, if
    not a tombstone."""
    last: dict[tuple[int, bytes], tuple[int, bytes | None]] = {}
    for p, o, k, v in rows:
        assert k is not None
        last[(p, k)] = (o, v)
    return {pk: (o, v) for pk, (o, v) in last.items() if v is not None}


def write(
    bootstrap: str, topic: str, steps: list[tuple[str, list[tuple[int, bytes, bytes | None]]]]
):
    """Each step ``(how, records)``: ``plain`` (no transaction), ``commit`` or ``abort``
    (one transaction). Returns how many records were aborted."""
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    tx = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx", "linger.ms": 5}
    )
    tx.init_transactions(30)
    aborted = 0
    for how, records in steps:
        producer = plain if how == "plain" else tx
        if how != "plain":
            tx.begin_transaction()
        for partition, key, value in records:
            producer.produce(topic, key=key, value=value, partition=partition)
        if how == "plain":
            assert plain.flush(30) == 0
        elif how == "commit":
            tx.commit_transaction(30)
        else:
            tx.flush(30)  # written to the log, then aborted: the records stay there
            tx.abort_transaction(30)
            aborted += len(records)
    return aborted


def create(broker, topic_factory, partitions: int, **config: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = topic_factory("tx")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 1, config=config)]).values():
        fut.result(timeout=30)
    return name


def spark_rows(df) -> list[Row]:  # type: ignore[no-untyped-def]
    rows = df.select("partition", "offset", "key", "value").collect()
    return sorted(
        ((r.partition, r.offset, r.key, r.value) for r in rows), key=lambda r: (r[0], r[1])
    )


def test_kafka_source_reads_what_a_plain_consumer_reads(spark, broker, topic_factory) -> None:
    topic = create(broker, topic_factory, 2)

    def recs(tag: str, counts: dict[int, int]) -> list[tuple[int, bytes, bytes | None]]:
        return [
            (p, f"{tag}-{p}-{i}".encode(), f"v-{tag}-{p}-{i}".encode())
            for p, n in counts.items()
            for i in range(n)
        ]

    aborted = write(
        broker.bootstrap,
        topic,
        [
            ("plain", recs("a", {0: 5, 1: 3})),
            ("commit", recs("b", {0: 4, 1: 3})),
            ("abort", recs("c", {0: 3, 1: 2})),
            ("plain", recs("d", {0: 2, 1: 2})),
            ("abort", recs("e", {1: 2})),
            ("commit", recs("f", {0: 2, 1: 1})),  # the topic ends with commit markers
        ],
    )
    uncommitted = plain_read(broker.bootstrap, topic, 2, "read_uncommitted")
    committed = plain_read(broker.bootstrap, topic, 2, "read_committed")
    marks = high_watermarks(broker.bootstrap, topic, 2)
    # What the topic holds: markers take offsets no consumer sees, aborted records are
    # seen by read_uncommitted readers only.
    assert len(uncommitted) - len(committed) == aborted == 7
    assert {r[2] for r in uncommitted} - {r[2] for r in committed} == {
        k for _, k, _ in recs("c", {0: 3, 1: 2}) + recs("e", {1: 2})
    }
    for p in range(2):
        offsets = [o for q, o, _, _ in uncommitted if q == p]
        markers = marks[p] - len(offsets)
        assert markers == (4 if p == 1 else 3), (p, offsets, marks)  # 2 commits, 1-2 aborts
        assert offsets[-1] < marks[p] - 1  # the last offset is a marker

    # Spark's source: read_uncommitted by default, as Spark's own connector.
    assert spark_rows(read_kafka(spark, broker.bootstrap, topic)) == uncommitted
    assert (
        spark_rows(
            read_kafka(
                spark, broker.bootstrap, topic, **{"kafka.isolation.level": "read_committed"}
            )
        )
        == committed
    )
    # Split into small ranges whose ends fall on markers and aborted records: the same.
    split = read_kafka(
        spark,
        broker.bootstrap,
        topic,
        maxRecordsPerPartition=3,
        **{"kafka.isolation.level": "read_committed"},
    )
    assert split.rdd.getNumPartitions() > 4
    assert spark_rows(split) == committed
    # The planned ranges end at the high watermark, markers included.
    assert {(r.partition, r.end) for r in plan_ranges(broker.bootstrap, topic)} == set(
        marks.items()
    )
    # Offsets given as JSON that point at a marker: the records before it, nothing else.
    first_marker = next(
        o for o in range(marks[0]) if o not in {o for q, o, _, _ in uncommitted if q == 0}
    )
    ranged = read_kafka(
        spark,
        broker.bootstrap,
        topic,
        starting={topic: {0: 0, 1: -2}},
        ending={topic: {0: first_marker + 1, 1: -1}},
    )
    assert spark_rows(ranged) == [r for r in uncommitted if r[0] == 1 or r[1] < first_marker]
    print(
        f"\ntransactions: high watermarks {marks}; read_uncommitted {len(uncommitted)} "
        f"records, read_committed {len(committed)}; Spark source identical at both levels"
    )


def test_journal_readers_read_what_a_plain_consumer_reads(
    spark, broker, topic_factory, tmp_path
) -> None:
    topic = create(broker, topic_factory, 2, **{"cleanup.policy": "compact"})

    def ref(p: int, key: str, seq: int) -> ActionRef:
        return ActionRef(key, seq, "Scoring.process#0", partition=p, topic="in")

    def rec(p: int, entry) -> tuple[int, bytes, bytes]:  # type: ignore[no-untyped-def]
        return (p, entry_key_bytes(entry), CODEC.encode(entry))

    steps = []
    for p in (0, 1):
        a, b = ref(p, f"user-{p}", 7), ref(p, f"user-{p}b", 9)
        pending = CallEntry(a, 0, "scoring.fetch", "d0", CallStatus.PENDING)
        steps += [
            ("plain", [rec(p, pending)]),
            (
                "commit",
                [
                    rec(p, CallEntry(a, 0, "scoring.fetch", "d0", CallStatus.SUCCEEDED, b"1")),
                    rec(p, CallEntry(a, 1, "scoring.score", "d1", CallStatus.PENDING)),
                ],
            ),
            # Aborted: a result for call 1, the ActionDone, a memory snapshot and a
            # tombstone of call 0. A reader that took them would see the action done.
            (
                "abort",
                [
                    rec(p, CallEntry(a, 1, "scoring.score", "d1", CallStatus.SUCCEEDED, b"2")),
                    rec(p, ActionDone(a, outputs=(b"{}",), calls=2)),
                    rec(p, MemorySnapshot(a.key, {"score": b"2"}, applied_seq=7)),
                    (p, entry_key_bytes(pending), None),
                ],
            ),
            ("plain", [rec(p, CallEntry(b, 0, "scoring.fetch", "e0", CallStatus.PENDING))]),
            (
                "commit",
                [
                    rec(p, CallEntry(b, 0, "scoring.fetch", "e0", CallStatus.SUCCEEDED, b"3")),
                    rec(p, MemorySnapshot(b.key, {"score": b"3"}, applied_seq=9)),
                ],
            ),
        ]
    write(broker.bootstrap, topic, steps)
    views = {
        iso: live(plain_read(broker.bootstrap, topic, 2, iso))
        for iso in ("read_uncommitted", "read_committed")
    }
    assert views["read_uncommitted"] != views["read_committed"]

    def expected(iso: str) -> list[tuple[int, int, bytes]]:
        return sorted((p, o, v) for (p, _), (o, v) in views[iso].items())

    for iso, extra in (
        ("read_uncommitted", {}),  # the Kafka source's default
        ("read_committed", {"kafka.isolation.level": "read_committed"}),
    ):
        for path, opts in (("journal source", {}), ("shuffle", {"maxRecordsPerPartition": 2})):
            df = read_journal(spark, broker.bootstrap, topic, include_raw=True, **extra, **opts)
            got = sorted(
                (r.partition, r.offset, r.raw_value)
                for r in df.select("partition", "offset", "raw_value").collect()
            )
            assert got == expected(iso), (iso, path)

    # The worker's cache rebuild reads as librdkafka does by default: read_committed.
    caches = {p: PartitionCache(tmp_path / f"p{p}") for p in (0, 1)}
    try:
        rebuild_partitions(broker.bootstrap, topic, caches, CODEC)
        cached = {
            (p, k): v
            for p, cache in caches.items()
            for k, v in cache.rocksdb_scan(b"")
            if not k.startswith(b"\x00")
        }
    finally:
        for cache in caches.values():
            cache.close()
    assert cached == {pk: v for pk, (_, v) in views["read_committed"].items()}
    print(
        f"\njournal in transactions: {len(views['read_committed'])} live records "
        f"read_committed (Spark journal source, shuffle path, cache rebuild agree), "
        f"{len(views['read_uncommitted'])} read_uncommitted (the Spark journal readers' "
        "default: aborted journal records included, unlike the worker's rebuild)"
    )
