"""Calls that take time: how many records a second a worker and a backfill task finish
when each record's one journaled call waits ``--latency-ms`` (a model, a payment API).

With calls that return at once the worker is CPU-bound (``bench_e2e.py``). Real calls
wait, and then what caps a worker is how many calls it keeps in progress: a sync
action's code block holds a thread while it runs, so ``threads / latency`` records a
second at most, whatever the in-flight limit. Before the eighteenth round that was 64
threads (1,280 records/s at 50 ms), and a ``spark backfill`` task ran its partition's
records one at a time (20 records/s at 50 ms).

Worker table: one worker process per row draining the same backlog (``--records`` JSON
records, 1,000 keys, 4 partitions) on one embedded broker, as in ``bench_e2e.py``:

- ``0 ms``: the same action with a call that returns at once, the worker's ceiling;
- sync actions with ``--code-block-threads`` 64 (the previous fixed pool), 256 (the
  default now) and 1024;
- an async action (``await asyncio.sleep``: no thread per call).

``cap`` is ``threads / latency`` (sync rows); ``vs 0 ms`` is the row against the
ceiling. Backfill table: one backfill task (``run_partition``, what each Spark task
runs; no Spark session) over ``--backfill-records`` records of 1,000 keys, with
``concurrency`` 1 (the previous behaviour) and the default 64. Faust table: the Faust
host (``durable_agent``, a sync action with the same call) one record at a time (its only
mode before the nineteenth round) and with ``concurrency=256``.

Run: ``.venv/bin/python bench/bench_slow_calls.py [--latency-ms 50] [--records 10000]``
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_e2e import KEYS, PARTITIONS, Variant, collect, create_topic, fill, start, stop
from common import parser, table

from agents_stream.testing import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]


def worker_variants(latency_ms: int) -> list[tuple[Variant, int]]:
    """(variant, thread count or 0) per row."""
    slow = {"AS_BENCH_CALLS": "1", "AS_BENCH_CALL_MS": str(latency_ms)}
    rows = [(Variant("sync, 0 ms call", "agents", {"AS_BENCH_CALLS": "1"}), 0)]
    for threads in (64, 256, 1024):
        label = f"sync, {latency_ms} ms call, {threads} threads"
        if threads == 256:
            label += " (default)"
        args = ["--code-block-threads", str(threads)]
        rows.append((Variant(label, "agents", slow, args=args), threads))
    rows.append(
        (Variant(f"async, {latency_ms} ms call", "agents", {**slow, "AS_BENCH_KIND": "async"}), 0)
    )
    return rows


def run_workers(records: int, latency_ms: int, timeout: float) -> list[tuple[object, ...]]:
    results: list[tuple[str, float, int, str]] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp_dir:
        tmp = Path(tmp_dir)
        for i, (variant, threads) in enumerate(worker_variants(latency_ms)):
            topic_in, topic_out = f"slow-{i}-in", f"slow-{i}-out"
            fill(broker.bootstrap, topic_in, records)
            create_topic(broker.bootstrap, topic_out, PARTITIONS)
            procs = start(variant, broker.bootstrap, topic_in, topic_out, tmp)
            try:
                _, (rate, _first_last, _drain), error, _busy = collect(
                    broker.bootstrap, topic_out, records, procs, timeout
                )
            finally:
                stop(procs)
            results.append((variant.name, rate, threads, error))
            print(f"  {variant.name}: {rate:,.0f} records/s {error}", file=sys.stderr, flush=True)
    ceiling = results[0][1] or 1.0
    rows: list[tuple[object, ...]] = []
    for name, rate, threads, error in results:
        cap = f"{threads / (latency_ms / 1000):,.0f}" if threads else ""
        rows.append((name, rate, cap, f"{rate / ceiling:.2f}", error[:60]))
    return rows


def run_backfill(records: int, latency_ms: int) -> list[tuple[object, ...]]:
    os.environ["AS_BENCH_CALL_MS"] = str(latency_ms)
    sys.path.insert(0, str(ROOT))
    from agents_stream.spark.jobs.backfill_task import BackfillTask, InputRecord, run_partition
    from bench.e2e.as_app import app

    inputs = [
        InputRecord(0, o, f"k{o % KEYS}", json.dumps({"id": o}).encode()) for o in range(records)
    ]
    rows: list[tuple[object, ...]] = []
    base = 0.0
    for concurrency in (1, 64):
        task = BackfillTask(
            app, 0, app.id, app.action_state_topic, "unused:9092", concurrency=concurrency
        )
        started = time.perf_counter()
        out = run_partition(task, 0, inputs, [])
        rate = len(out) / (time.perf_counter() - started)
        assert all(r["error"] is None for r in out), out[0]
        base = base or rate
        label = "one at a time (before)" if concurrency == 1 else "64 (default)"
        rows.append((f"backfill task, concurrency {label}", rate, f"{rate / base:.1f}x"))
    return rows


def run_faust(latency_ms: int, timeout: float) -> list[tuple[object, ...]]:
    """The Faust host (``durable_agent``) one record at a time (its only mode before) and
    with ``concurrency=256``; the first drains a smaller backlog (20 records/s at 50 ms)."""
    rows: list[tuple[object, ...]] = []
    base = 0.0
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-faust-") as tmp_dir:
        tmp = Path(tmp_dir)
        for i, (concurrency, records) in enumerate(((1, 200), (256, 4000))):
            topic_in, topic_out = f"faust-slow-{i}-in", f"faust-slow-{i}-out"
            fill(broker.bootstrap, topic_in, records)
            create_topic(broker.bootstrap, topic_out, PARTITIONS)
            env = {"AS_BENCH_CALL_MS": str(latency_ms), "AS_BENCH_CONCURRENCY": str(concurrency)}
            procs = start(Variant("faust host", "faust-durable", env), broker.bootstrap,
                          topic_in, topic_out, tmp)  # fmt: skip
            try:
                _, (rate, _first_last, _drain), error, _busy = collect(
                    broker.bootstrap, topic_out, records, procs, timeout
                )
            finally:
                stop(procs)
            base = base or rate or 1.0
            label = "1 (one at a time, before)" if concurrency == 1 else str(concurrency)
            rows.append((f"Faust host, concurrency {label}", rate, f"{rate / base:.1f}x", error))
            print(f"  faust {concurrency}: {rate:,.0f} records/s {error}", file=sys.stderr)
    return rows


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--latency-ms", type=int, default=50)
    p.add_argument("--records", type=int, default=0, help="worker backlog (default 20k, quick 10k)")
    p.add_argument("--backfill-records", type=int, default=0, help="default 2,000, quick 1,000")
    p.add_argument("--timeout", type=float, default=240)
    args = p.parse_args()
    records = args.records or (10_000 if args.quick else 20_000)
    backfill_records = args.backfill_records or (1_000 if args.quick else 2_000)
    worker_rows = run_workers(records, args.latency_ms, args.timeout)
    backfill_rows = run_backfill(backfill_records, args.latency_ms)
    faust_rows = run_faust(args.latency_ms, args.timeout)
    print(
        f"{records:,} records, {KEYS:,} keys, {PARTITIONS} partitions, one journaled call of "
        f"{args.latency_ms} ms per record; one worker process per row"
    )
    print(table(["worker", "records/s", "cap", "vs 0 ms", "note"], worker_rows))
    print()
    print(
        f"{backfill_records:,} records, {KEYS:,} keys, one {args.latency_ms} ms call each; one task"
    )
    print(table(["backfill", "records/s", "vs before"], backfill_rows))
    print()
    print(f"Faust host (durable_agent), one {args.latency_ms} ms call per record; one Faust worker")
    print(table(["Faust host", "records/s", "vs before", "note"], faust_rows))
    return 0 if all(not r[-1] for r in worker_rows + faust_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
