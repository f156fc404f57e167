"""End-to-end latency at a trickle: input produced -> output written, one record at a time.

A backlog drain (``bench_e2e.py``) measures throughput; this measures what a user of a
live agent sees when records arrive one by one (``--rate`` records/s, default 20). Each
row runs in this process on one embedded broker: a raw confluent-kafka
consume->produce loop (the baseline: the worker's own consumer and producer settings, a
consume that returns as soon as a record is there; both with ``fetch.wait.max.ms`` 10,
see ``FETCH_WAIT``), then an agents_stream worker (the
same app as ``bench_e2e.py``: sync action with 0 / 1 / 3 ``ctx.execute``, async with 1
``ctx.execute_async``). Latency = the output record's timestamp - the input's send time
(same clock); the group settles and the producer is warmed up before the first record.

``vs raw`` is the p50 against the raw loop's p50 (what agents_stream adds per record:
each journaled call is one acknowledged append on the record's path).

Run: ``.venv/bin/python bench/bench_latency.py [--records 100] [--rate 20] [--quick]``
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from common import create_topic, parser, percentile, table
from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PARTITIONS = 4
SETTLE = 6.0  # seconds for the worker's group join (~3 s on the embedded broker)
# The embedded broker holds a fetch that found no data for the whole fetch.wait.max.ms
# (500 ms by default; Kafka answers as soon as data arrives), which would dominate every
# row. Both the raw loop and the worker get this one (and no rebalance happens here).
FETCH_WAIT = {"fetch.wait.max.ms": 10}

VARIANTS = [
    ("raw confluent-kafka consume->produce loop", None),
    ("agents_stream, sync, 0 calls", ("sync", 0)),
    ("agents_stream, sync, 1 ctx.execute", ("sync", 1)),
    ("agents_stream, sync, 3 ctx.execute", ("sync", 3)),
    ("agents_stream, async, 1 ctx.execute_async", ("async", 1)),
]


def raw_loop(bootstrap: str, topic_in: str, topic_out: str, stop: threading.Event) -> None:
    from agents_stream.kafka.config import consumer_config, producer_config

    consumer = Consumer(consumer_config(bootstrap, f"raw-{uuid.uuid4().hex[:6]}", FETCH_WAIT))
    producer = Producer(producer_config(bootstrap))
    consumer.subscribe([topic_in])
    while not stop.is_set():
        for msg in consumer.consume(1, 0.1):
            if msg.error() is None:
                producer.produce(topic_out, msg.value(), msg.key())
        producer.poll(0)
    producer.flush(10)
    consumer.close()


def measure(
    bootstrap: str, topic_in: str, topic_out: str, records: int, rate: float
) -> list[float]:
    """Send ``records`` at ``rate``/s; returns each output's latency in seconds."""
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4().hex[:6]}",
         "fetch.wait.max.ms": 5, "log_level": 3}
    )  # fmt: skip
    reader.assign([TopicPartition(topic_out, p, 0) for p in range(PARTITIONS)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log_level": 3})
    producer.produce(topic_in, b'{"i": -1}', key=b"warm-up")  # connections and metadata
    producer.flush(10)
    time.sleep(SETTLE)
    sent: dict[bytes, float] = {}
    for i in range(records):
        key = f"k{i}".encode()
        sent[key] = time.time()
        producer.produce(topic_in, json.dumps({"i": i}).encode(), key=key)
        producer.poll(0)
        time.sleep(1 / rate)
    producer.flush(10)
    latencies: list[float] = []
    deadline = time.monotonic() + 30
    while len(latencies) < records and time.monotonic() < deadline:
        for msg in reader.consume(100, 0.2):
            key = msg.key()
            if msg.error() is None and key in sent:
                latencies.append(msg.timestamp()[1] / 1000 - sent[key])
    reader.close()
    return latencies


def run_variant(bootstrap: str, n: int, spec: tuple[str, int] | None, records: int, rate: float):
    topic_in, topic_out = f"lat-{n}-in", f"lat-{n}-out"
    create_topic(bootstrap, topic_in, PARTITIONS)
    create_topic(bootstrap, topic_out, PARTITIONS)
    stop = threading.Event()
    runner: Callable[[], object]
    if spec is None:

        def runner() -> None:
            raw_loop(bootstrap, topic_in, topic_out, stop)

        worker = None
    else:
        kind, calls = spec
        os.environ.update(
            AS_BENCH_APP=f"lat-{n}-{uuid.uuid4().hex[:6]}",
            AS_BENCH_INPUT=topic_in,
            AS_BENCH_OUTPUT=topic_out,
            AS_BENCH_CALLS=str(calls),
            AS_BENCH_KIND=kind,
        )
        import importlib

        import bench.e2e.as_app as as_app
        from agents_stream.runtime.worker import Worker

        as_app = importlib.reload(as_app)  # the app reads its settings when imported
        as_app.app.consumer_config = dict(FETCH_WAIT)
        data = tempfile.mkdtemp(prefix="bench-latency-")
        worker = Worker(as_app.app, broker=bootstrap, data_dir=data)
        runner = worker.run
    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    try:
        return measure(bootstrap, topic_in, topic_out, records, rate)
    finally:
        stop.set()
        if worker is not None:
            worker.stop()
        thread.join(30)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=0, help="records per row (100; quick 60)")
    p.add_argument("--rate", type=float, default=20.0, help="records per second")
    args = p.parse_args()
    records = args.records or (60 if args.quick else 100)
    logging.basicConfig(level=logging.WARNING)
    from agents_stream.testing import EmbeddedBroker

    rows = []
    base = 0.0
    with EmbeddedBroker() as broker:
        for n, (name, spec) in enumerate(VARIANTS):
            lat = sorted(
                x * 1000 for x in run_variant(broker.bootstrap, n, spec, records, args.rate)
            )
            if len(lat) < records:
                rows.append((name, f"{len(lat)}/{records} outputs", "", "", "", ""))
                continue
            p50 = percentile(lat, 50)
            base = base or p50
            rows.append(
                (name, f"{p50:.1f}", f"{percentile(lat, 90):.1f}", f"{percentile(lat, 99):.1f}",
                 f"{lat[-1]:.1f}", f"{p50 / base:.1f}x")
            )  # fmt: skip
    print(
        f"{records} records per row at {args.rate:g}/s, {PARTITIONS} partitions; one embedded broker"
    )
    print(table(["system", "p50 ms", "p90 ms", "p99 ms", "max ms", "p50 vs raw"], rows))
    return 0 if all(r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
