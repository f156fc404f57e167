"""Cost of journaling: events/s of an action with 1 and 3 durable calls vs none.

Drives the runner directly (no consumer) with many keys at once, as the worker does:
the records that can start together run as one batch per partition
(``durable.lane.run_records``; ``--per-record``: one ``ActionRunner.run`` each), under the
worker's interpreter settings (``runtime/tuning.py``), through the real store path: AckingProducer (the worker's producer config) -> fresh embedded broker
-> acked records applied to RocksDB -> futures resolved. Every variant pays the same
per-record ActionDone append; what differs is only how its trivial function is called:

- ``direct``: called (or awaited) in the action body, nothing journaled: the baseline;
- ``execute``: ``ctx.execute`` from a sync action (its body suspended on the loop while
  the function runs in the worker's 64-thread code block pool and its result is acked);
- ``execute_async``: ``await ctx.execute_async`` of a coroutine function from an async
  action (each call waits for its ack without holding a thread).

``ratio`` is events/s against the ``direct`` row of the same action kind; each row is
the best of ``--rounds`` interleaved rounds. The ack
latency columns are append -> future resolved (broker ack + RocksDB apply) under that
row's load; the line below the table is the same for one append at a time.

Run: ``.venv/bin/python bench/bench_journal.py [--records 20000] [--concurrency 500]
[--rounds 3] [--per-record] [--quick]``
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

from common import create_topic, parser, percentile, table

from agents_stream.agent import Agent, action
from agents_stream.durable.context import ContextConfig, RunnerContext
from agents_stream.durable.journal import (
    ActionRef,
    CallEntry,
    CallStatus,
    JournalEntry,
    Tombstone,
)
from agents_stream.durable.lane import run_records
from agents_stream.durable.payload import JSON
from agents_stream.durable.pool import CodeBlockPool
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.events import InputEvent
from agents_stream.kafka.config import producer_config
from agents_stream.kafka.producer import AckingProducer
from agents_stream.runtime.tuning import freeze_startup, record_processing, run_loop
from agents_stream.serde.journal import default_journal_codec
from agents_stream.state.kafka import KafkaActionStateStore
from agents_stream.testing import EmbeddedBroker

TOPIC = "bench-journal-action-state"
PARTITIONS = 4
POOL_THREADS = 64  # the worker's action pool size

Kind = Literal["sync", "async"]


class TimedStore(KafkaActionStateStore):
    """Records append -> resolution time of every append (the journal ack latency)."""

    samples: list[float]

    def append(self, entries: Sequence[JournalEntry | Tombstone], partition: int) -> Future[None]:
        started = time.perf_counter()
        fut = super().append(entries, partition)
        # Runs on the producer's poll thread right after the cache applied the acks.
        fut.add_done_callback(lambda _: self.samples.append(time.perf_counter() - started))
        return fut


def trivial(x: int) -> int:
    return x + 1


async def trivial_async(x: int) -> int:
    return x + 1


def make_agent(kind: Kind, calls: int, journaled: bool) -> type[Agent]:
    """An agent whose single action makes ``calls`` calls of a trivial function.

    Built per variant so that each one's ActionStates have their own action id.
    """
    if kind == "sync":

        def process(event: InputEvent, ctx: RunnerContext) -> None:
            for _ in range(calls):
                if journaled:
                    ctx.execute(trivial, event.input)
                else:
                    trivial(event.input)

        fn: Callable[..., Any] = process
    else:

        async def aprocess(event: InputEvent, ctx: RunnerContext) -> None:
            for _ in range(calls):
                if journaled:
                    await ctx.execute_async(trivial_async, event.input)
                else:
                    await trivial_async(event.input)

        fn = aprocess
    name = f"{kind.title()}{'Journaled' if journaled else 'Direct'}{calls}"
    return type(name, (Agent,), {"process": action(InputEvent)(staticmethod(fn))})


async def drive(
    runner: ActionRunner, records: int, concurrency: int, seq_base: int, per_record: bool = False
) -> float:
    """Run ``records`` distinct keys through ``runner``, ``concurrency`` in flight; events/s.

    As the worker does: the records that can start together run as one batch per
    partition (``durable.lane.run_records``), and each finished record makes room for the
    next. ``per_record``: one ``ActionRunner.run`` per record instead (the Faust host's
    and timers' path).
    """
    if per_record:
        todo = iter(range(records))

        async def lane() -> None:
            for i in todo:  # one shared iterator: each lane takes the next record when free
                await runner.run(record(i, seq_base))

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return records / (time.perf_counter() - started)

    pending = iter(range(records))
    free, finished = concurrency, 0
    wake = asyncio.Event()
    errors: list[BaseException] = []
    batches: set[asyncio.Future[None]] = set()

    def report(_: int, result: object) -> None:
        nonlocal free, finished
        free, finished = free + 1, finished + 1
        if isinstance(result, Exception):
            errors.append(result)
        wake.set()

    started = time.perf_counter()
    while finished < records:
        by_partition: dict[int, list[RecordInput]] = {}
        for i in itertools.islice(pending, free):
            by_partition.setdefault(i % PARTITIONS, []).append(record(i, seq_base))
        for batch in by_partition.values():
            free -= len(batch)
            task = asyncio.ensure_future(run_records(runner, batch, report))
            batches.add(task)
            task.add_done_callback(batches.discard)
        wake.clear()
        if finished < records:
            await wake.wait()
    if errors:
        raise errors[0]
    return records / (time.perf_counter() - started)


def record(i: int, seq_base: int) -> RecordInput:
    return RecordInput(key=f"k{i}", seq=seq_base + i, value=i, partition=i % PARTITIONS)


async def idle_latency(store: TimedStore, appends: int) -> list[float]:
    """Append -> ack of one CallEntry at a time: latency without queueing."""
    store.samples = []
    ref = ActionRef("idle", 0, "Idle.process#0")
    for i in range(appends):
        entry = CallEntry(ref, i, "bench.trivial", "0" * 32, CallStatus.SUCCEEDED, b"1")
        await asyncio.wrap_future(store.append([entry], 0))
    return store.samples


async def main_async(records: int, concurrency: int, rounds: int, per_record: bool) -> None:
    started = time.perf_counter()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as data_dir:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS, compact=True)
        producer = AckingProducer(producer_config(broker.bootstrap))
        # As in the worker: this loop serves the delivery reports (no poll thread).
        producer.serve_on(asyncio.get_running_loop(), threading.current_thread())
        store = TimedStore(
            topic=TOPIC,
            producer=producer,
            codec=default_journal_codec(),
            data_dir=Path(data_dir),
            bootstrap=broker.bootstrap,
        )
        store.samples = []
        for p in range(PARTITIONS):
            store.assign(p)
        pool = CodeBlockPool(POOL_THREADS)
        config = ContextConfig(app_id="bench", worker_id="bench", codec=JSON, executor=pool)

        def runner(kind: Kind, calls: int, journaled: bool) -> ActionRunner:
            return ActionRunner(make_agent(kind, calls, journaled), store, config)

        freeze_startup()
        # Warm-up (connections, thread pool, RocksDB) on seqs no measured row uses.
        await drive(runner("async", 1, True), min(2000, records), concurrency, 10**9, per_record)

        kinds: tuple[Kind, ...] = ("sync", "async")
        variants = [
            (kind, calls, journaled)
            for kind in kinds
            for calls, journaled in ((3, False), (1, True), (3, True))
        ]
        runners = {v: runner(*v) for v in variants}
        # Rounds interleave the variants so that a noisy neighbour slows all of them
        # alike; each variant keeps its best round (and that round's latencies). Every
        # round uses new seqs: a seq already done would be skipped, not run.
        best: dict[tuple[Kind, int, bool], tuple[float, list[float]]] = {}
        for r in range(rounds):
            for v in variants:
                store.samples = []
                rate = await drive(runners[v], records, concurrency, r * 10**7, per_record)
                if rate > best.get(v, (0.0, []))[0]:
                    best[v] = (rate, store.samples)
        rows: list[list[object]] = []
        for kind, calls, journaled in variants:
            rate, lat = best[(kind, calls, journaled)]
            baseline = best[(kind, 3, False)][0]
            call = "ctx.execute" if kind == "sync" else "ctx.execute_async"
            label = f"{kind} action, {calls} x {call if journaled else 'direct call'}"
            rows.append(
                [
                    label,
                    rate,
                    rate / baseline,
                    percentile(lat, 50) * 1000,
                    percentile(lat, 99) * 1000,
                ]
            )
        idle = await idle_latency(store, 300)
        pool.shutdown()
        store.close()
        producer.close()

    print(
        f"{records:,} records per row (best of {rounds} rounds), {concurrency} in flight, "
        f"{PARTITIONS} partitions, {'one run per record' if per_record else 'batches as in the worker'}, "
        f"code blocks on {POOL_THREADS} threads\n"
    )
    header = ["variant", "events/s", "ratio", "ack p50 ms", "ack p99 ms"]
    print(table(header, rows))
    print(
        f"\nidle journal ack latency (one CallEntry append at a time, {len(idle)} appends): "
        f"p50 {percentile(idle, 50) * 1000:.2f} ms, p99 {percentile(idle, 99) * 1000:.2f} ms"
    )
    print(f"total {time.perf_counter() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=None, help="records per variant (20000)")
    p.add_argument("--concurrency", type=int, default=500)
    p.add_argument("--per-record", action="store_true", help="ActionRunner.run per record")
    p.add_argument("--rounds", type=int, default=None, help="best of N rounds (3; 2 quick)")
    args = p.parse_args(argv)
    records = args.records or (5_000 if args.quick else 20_000)
    rounds = args.rounds or (2 if args.quick else 3)
    # The worker's interpreter settings and event loop (runtime/tuning.py).
    with record_processing():
        run_loop(main_async(records, args.concurrency, rounds, args.per_record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
