"""Throughput of the agents_stream.kafka Spark source against plain confluent-kafka.

Produces RECORDS records over PARTITIONS partitions to a fresh embedded broker, then
reads them back (best of ``--repeat`` runs, after one warm-up that starts the Python
workers) and prints rows/s:

- confluent-kafka: one process, one consumer assigned to every partition, touching
  key, value and offset of each record (the floor any Python reader pays);
- read_range: our executor-side reader in the same process, building Arrow batches;
- Spark count() and Spark groupBy(partition) over value lengths, ``local[N]``.

Run: ``.venv/bin/python bench/bench_spark_source.py [--records 300000] [--master local[2]]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from agents_stream.spark import (
    KafkaSourceOptions,
    get_spark,
    plan_offset_ranges,
    read_kafka,
    read_range,
    source_options,
)
from agents_stream.testing import EmbeddedBroker

TOPIC = "bench-spark-source"


def produce(bootstrap: str, records: int, partitions: int, value_size: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, partitions, 1)]).values():
        future.result(timeout=30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "compression.type": "none",
        }
    )
    payload = b"x" * value_size
    for i in range(records):
        producer.produce(TOPIC, key=b"key-%d" % (i % 1000), value=payload, partition=i % partitions)
        if i % 50_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "records left unsent"


def read_plain(bootstrap: str, partitions: int, ends: dict[int, int]) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # Same fetch tuning as the data source's readers, for a fair comparison.
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    remaining = {p for p in range(partitions) if ends[p] > 0}
    rows = size = 0
    while remaining:
        for m in consumer.consume(num_messages=10_000, timeout=1.0):
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(err)
                continue
            if m.offset() >= ends[m.partition()]:
                remaining.discard(m.partition())
                continue
            m.key()
            size += len(m.value())
            rows += 1
            if m.offset() == ends[m.partition()] - 1:
                remaining.discard(m.partition())
    consumer.close()
    return rows


def best_of(repeat: int, fn: Callable[[], int]) -> tuple[float, int]:
    best = float("inf")
    rows = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = fn()
        best = min(best, time.perf_counter() - t0)
    return best, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    with EmbeddedBroker() as broker:
        t0 = time.perf_counter()
        produce(broker.bootstrap, args.records, args.partitions, args.value_size)
        print(f"produced {args.records:,} records in {time.perf_counter() - t0:.1f}s")

        opts = KafkaSourceOptions.from_options(source_options(broker.bootstrap, TOPIC))
        ranges = plan_offset_ranges(opts)
        ends = {r.partition: r.end for r in ranges}
        assert sum(r.size for r in ranges) == args.records, ranges

        def arrow_direct() -> int:
            conf = opts.consumer_conf("reader")
            return sum(b.num_rows for r in ranges for b in read_range(conf, r))

        spark = get_spark("bench-spark-source", master=args.master)
        df = read_kafka(spark, broker.bootstrap, TOPIC)
        df.count()  # warm-up: starts the Python workers

        def spark_agg() -> int:
            rows = df.groupBy("partition").agg({"value": "count", "offset": "max"}).collect()
            return sum(r["count(value)"] for r in rows)

        results = [
            (
                "confluent-kafka, 1 process",
                *best_of(args.repeat, lambda: read_plain(broker.bootstrap, args.partitions, ends)),
            ),
            ("read_range -> Arrow, 1 process", *best_of(args.repeat, arrow_direct)),
            (f"Spark {args.master} count()", *best_of(args.repeat, df.count)),
            (f"Spark {args.master} groupBy().collect()", *best_of(args.repeat, spark_agg)),
        ]
        spark.stop()

    baseline = args.records / results[0][1]
    print(f"\n{'reader':<40} {'rows':>9} {'seconds':>8} {'rows/s':>10} {'vs plain':>8}")
    for name, seconds, rows in results:
        assert rows == args.records, f"{name} read {rows} rows"
        rate = rows / seconds
        print(f"{name:<40} {rows:>9,} {seconds:>8.2f} {rate:>10,.0f} {rate / baseline:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
