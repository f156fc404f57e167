"""Cache rebuild rate: ``KafkaActionStateStore.assign`` vs plainly consuming the topic.

Writes ``--records`` ActionState records (per action: three CallResults and one
ActionDone, encoded by the journal codec, keyed by ``entry_key_bytes``, lz4 as the worker
writes them) over ``--partitions`` partitions of a fresh embedded broker, then reads them
back with one consumer for all partitions, as a worker's assignment does, three ways (best
of ``--repeat`` interleaved rounds: each round reads every way once, so a slow moment of
the shared machine costs one round of each, not one way's every round):

- ``consume``: a confluent-kafka consumer with the rebuild's reader config and batch
  size, touching key and value of every record and stopping at the known end: the
  floor any Python reader pays;
- ``consume + decode``: the same plus ``JournalCodec.decode`` of every value (what the
  rebuild does to fail fast on corrupt records), to attribute the cost;
- ``assign``: ``KafkaActionStateStore.assign`` into a fresh data dir (consume, decode,
  RocksDB write batches, checkpoint).

``ratio`` is records/s against ``consume``. The last line is ``assign`` again on the
caught-up cache (only the checkpoint is read and the topic end confirmed): a fixed cost
per partition that every rebalance pays, included in the ``assign`` row too.

The last line is the store's call-slot lookup (one per action run's first call) of new
records after 20k records were pruned (their slots tombstoned): answered by the cache's
index of live slots, against the plain RocksDB prefix scan, whose seek walks the
tombstones past the prefix until compaction drops them.

Run: ``.venv/bin/python bench/bench_rebuild.py [--records 200000] [--partitions 2]``
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import create_topic, parser, table
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from agents_stream.durable import keys
from agents_stream.durable.journal import ActionDone, ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.config import producer_config, reader_config
from agents_stream.kafka.producer import AckingProducer
from agents_stream.serde.journal import JournalCodec, default_journal_codec
from agents_stream.state.cache import PartitionCache
from agents_stream.state.kafka import KafkaActionStateStore
from agents_stream.state.recovery import BATCH
from agents_stream.testing import EmbeddedBroker

TOPIC = "bench-rebuild-action-state"
RESULT = b'{"name":"Ada","tier":"gold","score":0.93,"tags":["a","b","c"]}'


def write(bootstrap: str, codec: JournalCodec, records: int, partitions: int) -> list[int]:
    """Produce ``records`` journal records round-robin by action; returns counts per partition."""
    producer = Producer(
        producer_config(
            bootstrap,
            {
                "linger.ms": 50,
                "queue.buffering.max.messages": 1_000_000,
                "enable.idempotence": False,
            },
        )
    )
    counts = [0] * partitions
    written = 0
    action = 0
    while written < records:
        p = action % partitions
        ref = ActionRef(f"user-{action % 10_000}", action, "Scoring.process#0", p, "scoring-in")
        entries: list[CallEntry | ActionDone] = [
            CallEntry(
                ref,
                i,
                f"scoring.step{i}",
                "9f86d081884c7d659a2feaa0c55ad015",
                CallStatus.SUCCEEDED,
                RESULT,
                call_id=ref.call_id("bench", i),
                started_ms=1_700_000_000_000,
                finished_ms=1_700_000_000_100,
                worker_id="bench",
            )
            for i in range(3)
        ]
        entries.append(ActionDone(ref, outputs=(RESULT,), calls=3, finished_ms=1_700_000_000_200))
        for entry in entries[: records - written]:
            while True:
                try:
                    producer.produce(
                        TOPIC, key=entry_key_bytes(entry), value=codec.encode(entry), partition=p
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
            counts[p] += 1
            written += 1
        action += 1
        if action % 5_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "records left unsent"
    return counts


def consume(bootstrap: str, counts: list[int], decode: JournalCodec | None) -> int:
    """Read every partition to its end (``counts``) with one consumer and the rebuild's
    reader config, as ``assign`` does, minus RocksDB; returns records read.

    It knows where the partitions end, so it never asks for more records than remain: a
    ``consume(n)`` call blocks until it has ``n`` records or times out.
    """
    consumer = Consumer(reader_config(bootstrap))
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(len(counts))])
    end = sum(counts)
    n = 0
    try:
        while n < end:
            for msg in consumer.consume(min(BATCH, end - n), timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(err)
                    continue
                key, value = msg.key() or b"", msg.value()
                if decode is not None and value is not None:
                    decode.decode(key, value)
                n += 1
        return n
    finally:
        consumer.close()


def rebuild(bootstrap: str, codec: JournalCodec, partitions: int, data_dir: Path) -> int:
    """``assign`` every partition into ``data_dir``; returns records replayed."""
    producer = AckingProducer(producer_config(bootstrap))  # lazy: never connects here
    store = KafkaActionStateStore(
        topic=TOPIC,
        producer=producer,
        codec=codec,
        data_dir=data_dir,
        bootstrap=bootstrap,
        # 200k live records: a journal that is not pruned, where the worker keeps no
        # live-entry index (App(prune_completed=False)); a pruned one is small.
        index_slots=False,
    )
    try:
        return store.assign(*range(partitions))  # as a worker does: one consumer for all
    finally:
        store.close()


def best_of(repeat: int, fn: Callable[[], int]) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        n = fn()
        best = min(best, time.perf_counter() - started)
    return best, n


def interleaved(
    repeat: int, ways: list[tuple[str, Callable[[], int]]]
) -> list[tuple[str, float, int]]:
    """Best time (and records read) of each way over ``repeat`` rounds of all of them."""
    best = {name: (float("inf"), 0) for name, _ in ways}
    for _ in range(repeat):
        for name, fn in ways:
            started = time.perf_counter()
            n = fn()
            best[name] = (min(best[name][0], time.perf_counter() - started), n)
    return [(name, *best[name]) for name, _ in ways]


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="best of N interleaved rounds")
    args = p.parse_args(argv)
    repeat = args.repeat
    started = time.perf_counter()
    codec = default_journal_codec()

    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        bootstrap = broker.bootstrap
        create_topic(bootstrap, TOPIC, args.partitions, compact=True)
        t0 = time.perf_counter()
        counts = write(bootstrap, codec, args.records, args.partitions)
        print(
            f"wrote {args.records:,} ActionState records ({counts} per partition) "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        dirs: list[Path] = []

        def assign_fresh() -> int:
            dirs.append(Path(tmp) / f"fresh-{len(dirs)}")
            return rebuild(bootstrap, codec, args.partitions, dirs[-1])

        results = interleaved(
            repeat,
            [
                ("consume", lambda: consume(bootstrap, counts, None)),
                ("consume + decode", lambda: consume(bootstrap, counts, codec)),
                ("assign (decode + RocksDB)", assign_fresh),
            ],
        )
        # The last fresh cache is caught up: assigning it again replays nothing.
        warm_seconds, warm_replayed = best_of(
            1, lambda: rebuild(bootstrap, codec, args.partitions, dirs[-1])
        )

    base = args.records / results[0][1]
    rows: list[list[object]] = []
    for name, seconds, n in results:
        assert n == args.records, f"{name} read {n} of {args.records} records"
        rows.append([name, n, seconds, n / seconds, (n / seconds) / base])
    print()
    print(table(["reader", "records", "seconds", "records/s", "ratio"], rows))
    print(
        f"\nassign on a caught-up cache: {warm_replayed} records replayed in "
        f"{warm_seconds * 1000:.0f} ms for {args.partitions} partitions"
    )
    with tempfile.TemporaryDirectory() as tmp:
        pruned = 20_000
        indexed, scanned = slot_lookups(Path(tmp), pruned)
    print(
        f"call-slot lookup of a new record after {pruned:,} pruned records: "
        f"{indexed:.1f} us with the live-entry index; {scanned:.1f} us as a RocksDB scan "
        f"(baseline, {scanned / indexed:.0f}x)"
    )
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


def slot_lookups(data_dir: Path, pruned: int) -> tuple[float, float]:
    """us per call-slot lookup of action runs with no slot yet (a new record's first
    call), after ``pruned`` records' slots were written and tombstoned (pruning): as the
    store does it (the index of live entries, then a scan only if it may find something) and as a
    plain prefix scan, whose seek walks the tombstones after the prefix."""
    cache = PartitionCache(data_dir / "slots")

    def ref(seq: int) -> ActionRef:
        return ActionRef(f"user-{seq % 1000}", seq, "Scoring.process#0", 0, "scoring-in")

    slots = [keys.call_key(ref(seq), 0) for seq in range(pruned)]
    for at in range(0, pruned, BATCH):
        cache.apply([(k, RESULT) for k in slots[at : at + BATCH]], at + BATCH)
        cache.apply([(k, None) for k in slots[at : at + BATCH]], at + BATCH)
    prefixes = [keys.calls_prefix(ref(seq)) for seq in range(pruned, pruned + 2000)]

    timings = []
    for lookup, n in ((cache.scan, len(prefixes)), (cache.rocksdb_scan, 200)):
        t0 = time.perf_counter()
        for prefix in prefixes[:n]:
            assert not lookup(prefix)
        timings.append((time.perf_counter() - t0) / n * 1e6)
    cache.close()
    return timings[0], timings[1]


if __name__ == "__main__":
    raise SystemExit(main())
