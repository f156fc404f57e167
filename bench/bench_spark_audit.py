"""Wall time of ``spark audit`` over a large ActionState topic, against a plain Python pass.

Generates ``--records`` ActionState records (default 500k) on a fresh embedded broker with
the journal codec and the store's key layout: per input record, call 0 SUCCEEDED, call 1
SUCCEEDED / FAILED / PENDING (94 / 4 / 2 %), an ActionDone unless a call is PENDING, and
for 5 % of inputs an earlier PENDING version of call 1 that compaction must discard.

Then measures, and prints as a table with records/s and the ratio to a plain Spark read:

- python: one process, one consumer over every partition keeping the last value per key
  (tombstones delete), decoding every live value and computing the audit's journal
  figures (status counts, in-flight, stuck, failures by type) with dicts;
- plain spark read (the baseline): the ``agents_stream.kafka`` source over the same topic,
  every value's length summed (so values are read, not pruned), ``local[2]``;
- spark audit (``run_audit`` without the input/output joins): read, compact, decode and
  every journal table, Parquet and reports written; best of ``--repeat`` after a warm-up.

Both must agree on the figures; the script fails if they do not.

Run: ``.venv/bin/python bench/bench_spark_audit.py [--quick] [--records N] [--master local[2]]``
(``--quick``: 100k records, what ``make bench`` runs).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections import Counter
from typing import Any

from common import parser as bench_parser
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import functions as F

from agents_stream import App
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
)
from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark import get_spark, read_kafka
from agents_stream.spark.jobs.audit import run_audit
from agents_stream.state.keys import entry_key_bytes
from agents_stream.testing import EmbeddedBroker

APP = App("bench-audit", prune_completed=False)
TOPIC = APP.action_state_topic
NOW_MS = 1_800_000_000_000
ACTION = "Bench.process#0"
PARTITIONS = 4


def _entries(i: int):
    ref = ActionRef(f"key-{i % 5000}", i, ACTION, i % PARTITIONS)
    started = NOW_MS - (3_600_000 if i % 100 == 0 else 10_000)

    def call(index: int, status: CallStatus, **kw) -> CallEntry:
        return CallEntry(
            ref, index, f"bench.fn{index}", "ab" * 8, status,
            call_id=ref.call_id(APP.id, index), started_ms=started, worker_id="w1", **kw,
        )  # fmt: skip

    out: list[CallEntry | ActionDone] = []
    if i % 20 == 0:  # an older PENDING version of slot 1, replaced below
        out.append(call(1, CallStatus.PENDING))
    out.append(call(0, CallStatus.SUCCEEDED, result=b'{"ok":1}', finished_ms=started + 5))
    kind = i % 50
    if kind == 0:
        out.append(call(1, CallStatus.PENDING))
        return out
    if kind in (1, 2):
        exc = ExceptionInfo("builtins.TimeoutError" if kind == 1 else "builtins.ValueError", "x")
        out.append(call(1, CallStatus.FAILED, exception=exc, finished_ms=started + 9))
    else:
        out.append(call(1, CallStatus.SUCCEEDED, result=b'"done"', finished_ms=started + 9))
    out.append(ActionDone(ref, outputs=(b'{"i":%d}' % i,), calls=2, finished_ms=started + 10))
    return out


def generate(bootstrap: str, records: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(timeout=30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    codec = default_journal_codec()
    n = i = 0
    while n < records:
        for entry in _entries(i):
            key, value = entry_key_bytes(entry), codec.encode(entry)
            while True:
                try:
                    producer.produce(TOPIC, value=value, key=key, partition=entry.ref.partition)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
        i += 1
        if i % 20_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0, "records left unsent"
    return n


def python_pass(bootstrap: str, stuck_after_ms: int) -> dict[str, int]:
    """The baseline: one consumer, last value per key, decode, count."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.max.bytes": 52428800,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    live: dict[tuple[int, bytes], bytes] = {}
    done: set[int] = set()
    while len(done) < PARTITIONS:
        for msg in consumer.consume(10_000, timeout=1.0):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition())
                continue
            k = (msg.partition(), msg.key())
            if msg.value() is None:
                live.pop(k, None)
            else:
                live[k] = msg.value()
    consumer.close()
    codec = default_journal_codec()
    status: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    states: set[tuple[str, int, str]] = set()
    completed: set[tuple[str, int, str]] = set()
    stuck = 0
    for (_, key), value in live.items():
        entry = codec.decode(key, value)
        assert isinstance(entry, CallEntry | ActionDone)  # all this bench writes
        ident = (entry.ref.key, entry.ref.seq, entry.ref.action)
        states.add(ident)
        if isinstance(entry, CallEntry):
            status[entry.status.value] += 1
            if entry.status is CallStatus.FAILED and entry.exception:
                failures[entry.exception.type] += 1
            if entry.status is CallStatus.PENDING and entry.started_ms < NOW_MS - stuck_after_ms:
                stuck += 1
        elif isinstance(entry, ActionDone):
            completed.add(ident)
    return {
        "journal_records": len(live),
        "action_states": len(states),
        "in_flight_action_states": len(states - completed),
        "calls_succeeded": status["SUCCEEDED"],
        "calls_failed": status["FAILED"],
        "calls_pending": status["PENDING"],
        "stuck_calls": stuck,
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if args.records is None:
        args.records = 100_000 if args.quick else 500_000
    stuck_after_s = 300
    with EmbeddedBroker() as broker:
        t0 = time.perf_counter()
        total = generate(broker.bootstrap, args.records)
        gen_s = time.perf_counter() - t0
        print(f"generated {total:,} ActionState records in {gen_s:.1f}s")
        t0 = time.perf_counter()
        expected = python_pass(broker.bootstrap, stuck_after_s * 1000)
        py_s = time.perf_counter() - t0
        spark = get_spark("bench-spark-audit", master=args.master)
        out = tempfile.mkdtemp(prefix="bench-audit-")
        raw = read_kafka(spark, broker.bootstrap, TOPIC)

        def plain_read() -> int:
            return raw.select(F.sum(F.length("value"))).collect()[0][0]

        plain_read()  # warm-up
        plain_s = float("inf")
        for _ in range(max(args.repeat, 2)):
            t0 = time.perf_counter()
            plain_read()
            plain_s = min(plain_s, time.perf_counter() - t0)
        kwargs: dict[str, Any] = dict(
            stuck_after_s=stuck_after_s, now_ms=NOW_MS, inputs=False, outputs=False
        )
        run_audit(spark, APP, broker.bootstrap, None, **kwargs)  # warm-up: Python workers
        best = float("inf")
        summary: dict[str, object] = {}
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            summary = run_audit(spark, APP, broker.bootstrap, out, **kwargs).summary
            best = min(best, time.perf_counter() - t0)
        spark.stop()
    for name, value in expected.items():
        assert summary[name] == value, f"{name}: spark {summary[name]} != python {value}"
    print(f"\n{'method':<44}{'records':>10}{'seconds':>10}{'records/s':>12}{'vs plain':>10}")
    for name, secs in (
        (f"plain spark read {args.master} (baseline)", plain_s),
        ("python single process (read+decode+count)", py_s),
        (f"spark audit {args.master} (all tables+reports)", best),
    ):
        print(f"{name:<44}{total:>10,}{secs:>10.2f}{total / secs:>12,.0f}{plain_s / secs:>9.2f}x")
    print(f"\nfigures (identical in both): {expected}")
    print(f"report: {out}/report.html")


if __name__ == "__main__":
    main()
