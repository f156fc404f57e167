"""Our ``agents_stream.kafka`` Spark source against Spark's own ``format("kafka")``.

Starts Apache Kafka (agents_stream.testing.kafka; or uses ``--bootstrap``), produces
RECORDS records over PARTITIONS partitions, then in one ``local[N]`` session with Spark's
connector on the classpath (agents_stream.spark.official_connector, fetched once with
mvn) times, per source, ``count()`` and a ``groupBy(partition)`` over value lengths (best
of ``--repeat`` after one warm-up), and checks both sources return the same rows
(partition, offset, value lengths summed per partition).

Run: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/bench_spark_official.py
[--records 200000] [--master local[2]]`` (under the broker lock on a shared machine);
``make bench`` runs it with 50k records (``--quick``).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from common import parser as bench_parser
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from agents_stream.spark import get_spark
from agents_stream.spark.official_connector import connector_jars
from agents_stream.spark.source import SOURCE_NAME

TOPIC = "bench-spark-official"


def produce(bootstrap: str, records: int, partitions: int, value_size: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, partitions, 1)]).values():
        future.result(timeout=30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "log_level": "3",
        }
    )
    payload = b"x" * value_size
    for i in range(records):
        while True:
            try:
                producer.produce(
                    TOPIC, key=b"key-%d" % (i % 1000), value=payload, partition=i % partitions
                )
                break
            except BufferError:  # the queue is full until the new topic's leader is known
                producer.poll(0.1)
    if producer.flush(120) != 0:
        raise SystemExit("records left unsent")


@contextlib.contextmanager
def kafka(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from agents_stream.testing.kafka import KafkaBroker

    with tempfile.TemporaryDirectory() as tmp, KafkaBroker(data_dir=Path(tmp)) as broker:
        yield broker.bootstrap


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    fn()  # warm-up: Python workers, JIT, connections
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=None, help="default 200k (quick 50k)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap", help="an Apache Kafka to use instead of starting one")
    args = parser.parse_args(argv)
    args.records = args.records or (50_000 if args.quick else 200_000)
    official = connector_jars()
    if isinstance(official, str):
        print(f"skipped: {official}")
        return 0
    version, jars = official
    with kafka(args.bootstrap) as bootstrap:
        produce(bootstrap, args.records, args.partitions, args.value_size)
        spark = get_spark("bench-spark-official", master=args.master, jars=jars)
        try:
            options = {"kafka.bootstrap.servers": bootstrap, "subscribe": TOPIC}
            frames = {
                "agents_stream.kafka": spark.read.format(SOURCE_NAME).options(**options).load(),
                f"spark-sql-kafka {version}": spark.read.format("kafka").options(**options).load(),
            }
            sums = {}
            print(
                f"{args.records:,} records x {args.value_size} B over {args.partitions} "
                f"partitions, Apache Kafka, {args.master}, best of {args.repeat}"
            )
            for name, df in frames.items():

                def grouped(df=df):  # type: ignore[no-untyped-def]
                    # A new DataFrame per run: collecting the same one twice reuses its
                    # shuffle output and reads nothing from Kafka (0.08 s for 200k rows).
                    return df.groupBy("partition").agg({"offset": "max", "value": "count"})

                def aggregate(g=grouped):  # type: ignore[no-untyped-def]
                    return g().collect()

                counted = best_of(args.repeat, df.count)
                aggregated = best_of(args.repeat, aggregate)
                sums[name] = sorted(tuple(r) for r in grouped().collect())
                print(
                    f"  {name:<24} count() {counted:6.2f} s ({args.records / counted:>9,.0f}"
                    f" rows/s)   groupBy {aggregated:6.2f} s ({args.records / aggregated:>9,.0f}"
                    " rows/s)"
                )
            if len({tuple(v) for v in sums.values()}) != 1:
                print(f"  DIFFERENT results: {sums}")
                return 1
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
