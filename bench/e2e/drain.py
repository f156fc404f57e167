"""One worker drain for ``bench/ab_worker.py``: ``drain.py RECORDS CALLS KIND``.

Imports agents_stream (and the bench app) from ``$AB_ROOT``, the checkout under test;
prints one JSON line: ``rate`` (outputs / span of their timestamps) and ``cpu_us`` (this
process's CPU time per record, every thread).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

ROOT = os.environ.get("AB_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]


def read_outputs(bootstrap: str, topic: str, records: int, found: Any) -> None:
    """Separate process: read ``records`` outputs, report their timestamps' span."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "log_level": 3})
    while True:
        meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.partitions:
            break
        time.sleep(0.2)
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    first, last, seen = None, None, 0
    while seen < records:
        for msg in consumer.consume(5000, 0.5):
            if msg.error() is None:
                stamp = msg.timestamp()[1]
                first = stamp if first is None else min(first, stamp)
                last = stamp if last is None else max(last, stamp)
                seen += 1
    found.put((first, last))


def main() -> None:
    records, calls, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    tag = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"ab-in-{tag}", f"ab-out-{tag}"
    os.environ.update(
        AS_BENCH_CALLS=calls,
        AS_BENCH_KIND=kind,
        AS_BENCH_INPUT=topic_in,
        AS_BENCH_OUTPUT=topic_out,
        AS_BENCH_APP=f"ab-{tag}",
    )
    logging.basicConfig(level=logging.WARNING)
    import bench_e2e

    from agents_stream.runtime.worker import Worker
    from agents_stream.testing import EmbeddedBroker
    from bench.e2e.as_app import app

    spawn = multiprocessing.get_context("spawn")
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as data:
        bench_e2e.fill(broker.bootstrap, topic_in, records)
        worker = Worker(app, broker=broker.bootstrap, data_dir=data)
        found = spawn.Queue()
        reader = spawn.Process(
            target=read_outputs, args=(broker.bootstrap, topic_out, records, found)
        )
        reader.start()
        span: list[tuple[int, int]] = []

        def stop_when_read() -> None:
            span.append(found.get())
            worker.stop()

        threading.Thread(target=stop_when_read, daemon=True).start()
        cpu = time.process_time()
        worker.run()
        cpu = time.process_time() - cpu
        reader.join()
    first, last = span[0]
    print(json.dumps({"rate": records / ((last - first) / 1000), "cpu_us": cpu / records * 1e6}))


if __name__ == "__main__":
    main()
