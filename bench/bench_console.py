"""The console's journal index over a journal of a million records: memory, first read, pages.

Makes ``--records`` ActionState records (per action run: three CallResults and one
ActionDone with one output, encoded by the journal codec, v5 keys, ``--keys`` record
keys; one run in 1,000 left with its last call PENDING and no ActionDone, as a worker
killed inside a reconcilable call leaves it) over ``--partitions`` partitions, then
reads them into :class:`agents_stream.console.journal.JournalIndex` two ways, each in a
child process of its own, so that its RSS growth is that reader's alone:

- ``broker``: the records are produced to a fresh embedded broker and the console's own
  ``JournalTailer`` reads the topic from the beginning until caught up (what
  ``agents-stream ui`` does at start): its growth includes librdkafka's fetch buffers;
- ``index alone``: the same records, encoded in batches, handed straight to
  ``JournalIndex.apply`` (no broker, no consumer): the index's own cost.

Printed per way: seconds to read every record and records/s; RSS before and after,
the growth per record, the record bytes per record (key + value, what any copy of the
journal holds) and the overhead per record beyond them. Then the latency (median and
p99 over ``--lookups`` random picks) of what a page asks the index: a key's history
page (its entries decoded, grouped into runs, rendered as HTML), the overview's counts,
a call id lookup, an output identity lookup and the PENDING page. No baseline: the
figures are the console's own, to compare across commits (bench/HISTORY.md).

Run: ``.venv/bin/python bench/bench_console.py [--records 1000000] [--keys 50000]``
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from common import create_topic, parser, percentile, produce_all, table

from agents_stream.console import pages
from agents_stream.console.history import key_history
from agents_stream.console.journal import JournalIndex, JournalTailer
from agents_stream.durable.journal import ActionDone, ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.durable.output_identity import output_prefix
from agents_stream.serde.journal import JournalCodec, default_journal_codec
from agents_stream.testing import EmbeddedBroker

APP = "bench"
TOPIC = f"{APP}-action-state"
SOURCE = "orders"
RESULT = b'{"name":"Ada","tier":"gold","score":0.93,"tags":["a","b","c"]}'
PENDING_EVERY = 1_000  # one run in this many is left PENDING


def run_ref(run: int, keys: int, partitions: int) -> ActionRef:
    key = run % keys
    return ActionRef(f"user-{key}", run, "Scoring.process#0", key % partitions, SOURCE)


def journal(
    codec: JournalCodec, records: int, keys: int, partitions: int
) -> Iterator[tuple[int, bytes, bytes]]:
    """``records`` (partition, raw key, value) of action runs, as workers write them."""
    written = run = 0
    while written < records:
        ref = run_ref(run, keys, partitions)
        stuck = run % PENDING_EVERY == PENDING_EVERY - 1
        entries: list[CallEntry | ActionDone] = [
            CallEntry(
                ref,
                i,
                f"scoring.step{i}",
                "9f86d081884c7d659a2feaa0c55ad015",
                CallStatus.PENDING if stuck and i == 2 else CallStatus.SUCCEEDED,
                None if stuck and i == 2 else RESULT,
                call_id=ref.call_id(APP, i),
                started_ms=1_700_000_000_000 + run,
                finished_ms=0 if stuck and i == 2 else 1_700_000_000_100 + run,
                worker_id="host-12345",
            )
            for i in range(3)
        ]
        if not stuck:
            entries.append(ActionDone(ref, outputs=(RESULT,), calls=3, finished_ms=run))
        for entry in entries[: records - written]:
            yield ref.partition, entry_key_bytes(entry), codec.encode(entry)
            written += 1
        run += 1


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def read(way: str, bootstrap: str, records: int, keys: int, partitions: int) -> dict[str, float]:
    """One way's figures (run in a child process: see the module docstring)."""
    codec = default_journal_codec(None, TOPIC)
    index = JournalIndex(codec.decode, APP)
    gc.collect()
    before = rss_bytes()
    if way == "broker":
        started = time.perf_counter()
        tailer = JournalTailer(bootstrap, TOPIC, index).start()
        assert tailer.wait_caught_up(600), index.error
        seconds = time.perf_counter() - started
        tailer.stop()
    else:
        seconds = 0.0
        # Encoded in batches, then applied (only the applies timed): the index owns
        # every byte it keeps, as when a consumer hands it records.
        batch: list[tuple[int, bytes, bytes]] = []
        ends = dict.fromkeys(range(partitions), 0)
        for n, record in enumerate(journal(codec, records, keys, partitions)):
            batch.append(record)
            if len(batch) == 10_000 or n == records - 1:
                started = time.perf_counter()
                for partition, key, value in batch:
                    index.apply(key, value, partition, ends[partition])
                    ends[partition] += 1
                seconds += time.perf_counter() - started
                batch = []
    gc.collect()
    after = rss_bytes()
    stats = index.stats()
    assert stats["entries"] == records, stats
    return {"seconds": seconds, "before": before, "after": after,
            **lookups(index, records, keys, partitions)}  # fmt: skip


def lookups(index: JournalIndex, records: int, keys: int, partitions: int) -> dict[str, float]:
    """Median and p99 (ms) of each page's use of the index over random picks."""
    rng = random.Random(55)
    runs = records // 4
    n = LOOKUPS

    def timed(name: str, make: Callable[[int], Callable[[], object]]) -> dict[str, float]:
        samples = []
        for _ in range(n):
            call = make(rng.randrange(runs))
            started = time.perf_counter()
            assert call(), name
            samples.append((time.perf_counter() - started) * 1000)
        return {f"{name} p50": percentile(samples, 50), f"{name} p99": percentile(samples, 99)}

    def key_page(run: int) -> Callable[[], object]:
        key = run_ref(run, keys, partitions).key
        return lambda: pages.history_body(key_history(key, index.entries_of(key)), APP, None)

    def call_id(run: int) -> Callable[[], object]:
        query = run_ref(run, keys, partitions).call_id(APP, 1)
        return lambda: index.find(query)

    def output(run: int) -> Callable[[], object]:
        run -= run % PENDING_EVERY == PENDING_EVERY - 1  # a run with an ActionDone
        done = ActionDone(run_ref(run, keys, partitions), outputs=(RESULT,), finished_ms=run)
        query = f"{output_prefix(APP, done)}0"
        return lambda: index.find(query)

    def pending(_: int) -> Callable[[], object]:
        now = int(time.time() * 1000)
        return lambda: pages.pending_body(index.pending(), now, index.settled())

    figures: dict[str, float] = {}
    figures |= timed("key page", key_page)
    figures |= timed("overview counts", lambda _: index.stats)
    figures |= timed("call id", call_id)
    figures |= timed("output identity", output)
    figures |= timed("PENDING page", pending)
    figures["pending"] = len(index.pending())
    return figures


LOOKUPS = 1_000


def child(way: str, bootstrap: str, args: argparse.Namespace) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", way, "--bootstrap", bootstrap,
         "--records", str(args.records), "--keys", str(args.keys),
         "--partitions", str(args.partitions)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=None, help="default 1,000,000 (quick 200,000)")
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--child", choices=["broker", "index"], help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.records is None:
        args.records = 200_000 if args.quick else 1_000_000
    if args.child:
        print(
            json.dumps(read(args.child, args.bootstrap, args.records, args.keys, args.partitions))
        )
        return 0
    started = time.perf_counter()
    results: dict[str, dict[str, float]] = {}
    with EmbeddedBroker() as broker:
        create_topic(broker.bootstrap, TOPIC, args.partitions, compact=True)
        t0 = time.perf_counter()
        records = journal(
            default_journal_codec(None, TOPIC), args.records, args.keys, args.partitions
        )
        record_bytes = produce_all(broker.bootstrap, TOPIC, records)
        print(
            f"wrote {args.records:,} ActionState records ({args.keys:,} keys, "
            f"{args.partitions} partitions) in {time.perf_counter() - t0:.1f} s"
        )
        results["broker (JournalTailer)"] = child("broker", broker.bootstrap, args)
    results["index alone (apply)"] = child("index", "", args)

    n = args.records
    print(f"record bytes (key + value): {record_bytes / n:.0f} per record, "
          f"{record_bytes / 2**20:.0f} MB in all")  # fmt: skip
    rows: list[list[object]] = []
    for way, f in results.items():
        growth = f["after"] - f["before"]
        rows.append([way, f["seconds"], n / f["seconds"], f["before"] / 2**20,
                     f["after"] / 2**20, growth / n, (growth - record_bytes) / n])  # fmt: skip
    print()
    print(table(["read", "seconds", "records/s", "RSS before MB", "after MB",
                 "bytes/record", "beyond record bytes"], rows))  # fmt: skip
    names = ["key page", "overview counts", "call id", "output identity", "PENDING page"]
    lat = [[way, *(f"{f[f'{x} p50']:.3f} / {f[f'{x} p99']:.3f}" for x in names)]
           for way, f in results.items()]  # fmt: skip
    pending = int(next(iter(results.values()))["pending"])
    print(f"\nlatency, ms (p50 / p99 of {LOOKUPS:,} random picks; {pending} PENDING calls)")
    print(table(["read", *names], lat))
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
