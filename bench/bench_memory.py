"""Worker memory while draining a backlog: is RSS flat, and what does a record in flight cost?

One agents_stream worker (sync action, one ``ctx.execute`` per record) drains a backlog of
``--records`` JSON records (1,000 keys, 4 partitions) on an embedded broker. Every second
the worker's RSS (``/proc/PID/status``) is sampled next to the outputs produced so far.
The table shows RSS at each tenth of the drain; the summary gives the growth over the
second half of the drain per record processed (flat: close to 0 bytes) and the RSS above
the idle worker's per in-flight record (``max_in_flight`` records are admitted at once).

Baseline: the worker's own RSS once its partitions are assigned, before the backlog
drains (the ratio column is RSS / that baseline).

Run: ``.venv/bin/python bench/bench_memory.py [--records 300000] [--quick]``
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench_e2e import PARTITIONS, Variant, fill, start, stop
from common import create_topic, parser, table
from confluent_kafka import Consumer, TopicPartition

from agents_stream.app import App
from agents_stream.testing import EmbeddedBroker

MAX_IN_FLIGHT = App("defaults").max_in_flight


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=0, help="backlog (default 300k, quick 60k)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds for the drain")
    args = p.parse_args()
    records = args.records or (60_000 if args.quick else 300_000)
    variant = Variant("agents_stream, sync, 1 ctx.execute", "agents", {"AS_BENCH_CALLS": "1"})
    samples: list[tuple[float, int, float]] = []  # (seconds, outputs, rss MB)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp:
        topic_in, topic_out = "mem-in", "mem-out"
        fill(broker.bootstrap, topic_in, records)
        create_topic(broker.bootstrap, topic_out, PARTITIONS)
        procs = start(variant, broker.bootstrap, topic_in, topic_out, Path(tmp))
        pid = procs[0].pid
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": f"mem-{uuid.uuid4().hex[:6]}",
                "log_level": 3,
            }
        )
        consumer.assign([TopicPartition(topic_out, n, 0) for n in range(PARTITIONS)])
        outputs, started = 0, time.monotonic()
        last_sample = 0.0
        try:
            while outputs < records and time.monotonic() - started < args.timeout:
                if procs[0].poll() is not None:
                    print(f"worker exited with {procs[0].returncode}", file=sys.stderr)
                    return 1
                outputs += sum(1 for m in consumer.consume(5000, 0.2) if not m.error())
                now = time.monotonic() - started
                if now - last_sample >= 1.0:
                    samples.append((now, outputs, rss_mb(pid)))
                    last_sample = now
            samples.append((time.monotonic() - started, outputs, rss_mb(pid)))
        finally:
            consumer.close()
            stop(procs)
    draining = [s for s in samples if s[1] > 0]
    if len(draining) < 4:
        print("too few samples while draining", file=sys.stderr)
        return 1
    idle = max(s[2] for s in samples if s[1] == 0) if any(s[1] == 0 for s in samples) else 0
    base = idle or draining[0][2]
    rows = []
    for tenth in range(1, 11):
        goal = records * tenth // 10
        hit = next((s for s in draining if s[1] >= goal), draining[-1])
        rows.append((f"{hit[1]:,} records", round(hit[2], 1), f"{hit[2] / base:.2f}"))
    half = [s for s in draining if s[1] >= records // 2]
    first, last = half[0], half[-1]
    growth = (last[2] - first[2]) * 1024 * 1024 / max(last[1] - first[1], 1)
    peak = max(s[2] for s in draining)
    print(f"{records:,} records, 1 journaled call each; worker RSS (MB) while draining")
    print(table(["processed", "RSS MB", "vs idle worker"], rows))
    print(
        f"idle worker {base:.1f} MB, peak {peak:.1f} MB; second half of the drain: "
        f"{growth:+.0f} bytes per record processed; peak above idle per in-flight record "
        f"(max_in_flight={MAX_IN_FLIGHT}): {(peak - base) * 1024 * 1024 / MAX_IN_FLIGHT:,.0f} bytes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
