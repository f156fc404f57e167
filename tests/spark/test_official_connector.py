"""Our ``agents_stream.kafka`` source against Spark's own ``format("kafka")``
(``spark-sql-kafka-0-10`` from Maven Central, on the session's classpath: see
``tests/spark/conftest.py``), on Apache Kafka, in one Spark session: the same options go
to both and the schema and every row (headers included) must be equal.

The topics hold what a Spark user's topics hold: null keys, tombstones, repeated and
binary headers (one with a null value), explicit CreateTime stamps, a LogAppendTime
topic, committed and aborted transactions interleaved with plain records, and a
transaction still open while both read. The reads: ``subscribePattern`` found in the
middle of the names with Java client option names, ``read_uncommitted`` and
``read_committed`` (which must stop at the last stable offset), ``assign`` with JSON
ranges, timestamps with both strategies, an end past the partition's end with
``failOnDataLoss=false``, and a pattern matching nothing.

Skipped with one line where the connector cannot be had (no mvn, nothing served for the
installed PySpark or the release before it).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from agents_stream.spark.source import SOURCE_NAME
from tests.spark.conftest import official_connector

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.kafka_only]

# CreateTime of the first record, each next one a second later: an hour ago, as Kafka
# deletes records whose timestamps are older than retention.ms (7 days) at its next check.
T0 = (int(time.time()) - 3600) * 1000


def _create(bootstrap: str, topics: dict[str, dict[str, str]], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [
        NewTopic(name, partitions, 1, config={"retention.ms": "-1", **conf})
        for name, conf in topics.items()
    ]
    for fut in admin.create_topics(new).values():
        fut.result(timeout=30)


def _fill(bootstrap: str, plain: str, log_append: str, tx_topic: str) -> Producer:
    """Writes the records; returns the transactional producer with a transaction open."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(30):
        headers: list[tuple[str, Any]] | None = None
        if i % 3 == 0:
            headers = [("h", b"a"), ("h", b"b"), ("bin", bytes([0, 255, i])), ("none", None)]
        producer.produce(
            plain,
            key=None if i % 4 == 0 else f"k{i % 5}".encode(),
            value=None if i % 7 == 6 else f"v{i}".encode(),  # tombstones
            partition=i % 3,
            headers=headers,
            timestamp=T0 + i * 1000,
        )
        producer.produce(log_append, key=b"k", value=bytes([i]), partition=i % 3)
    producer.flush(30)
    tx = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"{tx_topic}-tx", "linger.ms": 5}
    )
    tx.init_transactions(30)
    for step, how in enumerate(("plain", "commit", "abort", "plain", "commit", "abort", "open")):
        if how != "plain":
            tx.begin_transaction()
        target = producer if how == "plain" else tx
        for i in range(4):
            target.produce(
                tx_topic, key=b"%d" % i, value=f"{how}-{step}-{i}".encode(), partition=i % 3
            )
        if how == "plain":
            producer.flush(30)
        elif how == "commit":
            tx.commit_transaction(30)
        elif how == "abort":
            tx.flush(30)
            tx.abort_transaction(30)
        else:
            tx.flush(30)  # in the log, neither committed nor aborted while the reads run
    return tx


def _rows(df) -> list[tuple]:  # type: ignore[no-untyped-def]
    out = []
    for r in df.collect():
        row = r.asDict()
        if "headers" in row and row["headers"] is not None:
            row["headers"] = tuple((h["key"], h["value"]) for h in row["headers"])
        out.append(tuple(sorted(row.items())))
    return sorted(out, key=lambda r: (dict(r)["topic"], dict(r)["partition"], dict(r)["offset"]))


def test_rows_equal_sparks_own_kafka_source(spark, broker, tmp_path) -> None:
    official = official_connector()
    if isinstance(official, str):
        pytest.skip(official)
    version = official[0]
    token = uuid.uuid4().hex[:8]
    plain, log_append, tx_topic = (f"xc-{token}-{n}" for n in ("plain", "logappend", "tx"))
    _create(
        broker.bootstrap,
        {plain: {}, log_append: {"message.timestamp.type": "LogAppendTime"}, tx_topic: {}},
        3,
    )
    tx = _fill(broker.bootstrap, plain, log_append, tx_topic)
    base = {"kafka.bootstrap.servers": broker.bootstrap, "includeHeaders": "true"}
    # Java client names, as Spark users write them: translated for our reader.
    java_names = {"kafka.fetch.max.wait.ms": "50", "kafka.max.poll.records": "7"}
    cases: dict[str, dict[str, str]] = {
        "pattern, read_uncommitted": {"subscribePattern": f"{token}-", **java_names},
        "pattern, read_committed (open transaction)": {
            "subscribePattern": f"-{token}-(plain|tx)$",
            "kafka.isolation.level": "read_committed",
            "endingOffsets": "latest",
        },
        "assign, JSON ranges": {
            "assign": json.dumps({plain: [0, 2], tx_topic: [1]}),
            "startingOffsets": json.dumps({plain: {"0": 2, "2": -2}, tx_topic: {"1": 1}}),
            "endingOffsets": json.dumps({plain: {"0": 7, "2": -1}, tx_topic: {"1": -1}}),
            "kafka.isolation.level": "read_committed",
        },
        "timestamps": {
            "subscribe": plain,
            "startingTimestamp": str(T0 + 5_500),
            "endingOffsetsByTimestamp": json.dumps(
                {plain: {"0": T0 + 20_000, "1": T0 + 99_000_000, "2": T0 + 12_000}}
            ),
        },
        "timestamp past the end, strategy latest": {
            "subscribe": plain,
            "startingOffsetsByTimestamp": json.dumps(
                {plain: {"0": T0, "1": T0 + 99_000_000, "2": T0 + 3_000}}
            ),
            "startingOffsetsByTimestampStrategy": "latest",
        },
        "end past the end, failOnDataLoss=false": {
            "subscribe": plain,
            "endingOffsets": json.dumps({plain: {"0": 500, "1": -1, "2": 4}}),
            "failOnDataLoss": "false",
            # Spark's reader polls this long before it finds the offset missing.
            "kafkaConsumer.pollTimeoutMs": "2000",
        },
        "pattern matching nothing": {"subscribePattern": f"^{token}-nothing"},
    }
    timings: dict[str, list[float]] = {"ours": [], "official": []}
    try:
        for name, options in cases.items():
            results = {}
            print(f"\n{name}", end="", flush=True)
            for label, fmt in (("official", "kafka"), ("ours", SOURCE_NAME)):
                df = spark.read.format(fmt).options(**base, **options).load()
                started = time.perf_counter()
                results[label] = (df.schema, _rows(df))
                timings[label].append(time.perf_counter() - started)
            assert results["ours"][0] == results["official"][0], name
            assert results["ours"][1] == results["official"][1], name
            if name.startswith("pattern, read_committed"):
                committed = [r for r in results["ours"][1] if dict(r)["topic"] == tx_topic]
                assert all(b"open" not in dict(r)["value"] for r in committed), name
                assert sum(b"commit" in dict(r)["value"] for r in committed) == 8, name
            elif name != "pattern matching nothing":
                assert results["ours"][1], name  # every case but the last reads something
    finally:
        tx.abort_transaction(30)
    print(
        f"\nofficial spark-sql-kafka-0-10 {version} vs agents_stream.kafka: {len(cases)} reads, "
        f"schema and rows equal; collect time ours {sum(timings['ours']):.2f}s, official "
        f"{sum(timings['official']):.2f}s"
    )
