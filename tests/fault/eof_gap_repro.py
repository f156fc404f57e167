"""Reproduce offset gaps at a cooperative rebalance with plain confluent-kafka consumers.

Not collected by pytest (it demonstrates a client/broker behaviour, not ours): two
consumers of one group (cooperative-sticky, manual offsets, the worker's calls in the
assign callback) read a trickle on 6 partitions of the embedded broker; a third member
in a subprocess is SIGKILLed so the two take over its partitions. Every record of a
partition a consumer keeps must arrive with offset = previous + 1 (the input is neither
compacted nor transactional); a gap is a record the client never handed over.

Measured here (librdkafka 2.12.1, Tansu 0.6.0): with ``enable.partition.eof`` on and
``fetch.wait.max.ms`` 50, 2-3 gaps per run in 2 of 2 runs; none with EOF off at 50 ms
(3 runs) or with EOF on at librdkafka's default 500 ms. The worker enables partition EOF
(held timers arm on it) and keeps the default fetch wait; on a gap it fetches the
partition again from the first missing offset, so skipped records come back
(``agents_stream_offset_gaps_recovered_total``; ``tests/integration/test_offset_gaps.py``).
To see whether your cluster's clients skip records: ``python
tests/fault/eof_gap_repro.py --fetch-wait 50 --eof [--bootstrap host:9092]``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

PARTITIONS = 6
MEMBER = r"""
import sys
from confluent_kafka import Consumer
conf = dict(__import__("json").loads(sys.argv[1]))
c = Consumer(conf)
c.subscribe([sys.argv[2]])
while True:
    for m in c.consume(500, 0.01):
        if not m.error():
            c.commit(m, asynchronous=True)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fetch-wait", type=int, default=50)
    p.add_argument("--eof", action="store_true", help="enable.partition.eof (as the worker)")
    p.add_argument("--bootstrap", default="", help="a cluster (default: an embedded broker)")
    args = p.parse_args()
    if args.bootstrap:
        return run(args.bootstrap, args)
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from agents_stream.testing import EmbeddedBroker

    with EmbeddedBroker() as broker:
        return run(broker.bootstrap, args)


def run(bootstrap: str, args: argparse.Namespace) -> int:
    from agents_stream.testing.topics import create_topics

    topic, group = f"gap-{uuid.uuid4().hex[:6]}", f"gap-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1500,
        "partition.assignment.strategy": "cooperative-sticky",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": args.fetch_wait,
        "enable.partition.eof": args.eof,
        "log_level": 0,
    }
    stop = threading.Event()
    gaps: list[tuple[str, int, int, int]] = []

    def feed() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        while not stop.is_set():
            for partition in range(PARTITIONS):
                producer.produce(topic, b"x", key=b"k", partition=partition)
            producer.poll(0)
            time.sleep(0.15)
        producer.flush(10)

    def consume(name: str) -> None:
        last: dict[int, int] = {}

        def on_assign(consumer: Consumer, parts: list[TopicPartition]) -> None:
            for tp in parts:  # what the worker's assign callback asks the client
                last.pop(tp.partition, None)
                consumer.get_watermark_offsets(tp, timeout=5.0, cached=False)
                consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=5.0)
            time.sleep(0.05)  # its cache rebuild

        def on_revoke(consumer: Consumer, parts: list[TopicPartition]) -> None:
            for tp in parts:
                last.pop(tp.partition, None)

        consumer = Consumer(conf)
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        committed_at = time.monotonic()
        while not stop.is_set():
            for msg in consumer.consume(500, 0.01):
                if msg.error():
                    continue
                partition, offset = msg.partition(), msg.offset()
                if partition in last and offset != last[partition] + 1:
                    gaps.append((name, partition, last[partition], offset))
                last[partition] = offset
            if last and time.monotonic() - committed_at > 0.3:
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()],
                    asynchronous=True,
                )
                committed_at = time.monotonic()
        consumer.close()

    member = subprocess.Popen([sys.executable, "-c", MEMBER, json.dumps(conf), topic])
    threads = [threading.Thread(target=consume, args=(n,)) for n in "AB"]
    for t in threads:
        t.start()
    threading.Thread(target=feed, daemon=True).start()
    time.sleep(12)
    member.send_signal(signal.SIGKILL)
    member.wait()
    time.sleep(20)
    stop.set()
    for t in threads:
        t.join(15)
    print(json.dumps({"fetch.wait.max.ms": args.fetch_wait, "eof": args.eof, "gaps": gaps}))
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
