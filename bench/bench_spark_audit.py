"""Wall time of ``spark audit`` over a large ActionState topic, against a plain Python pass.

Generates ``--records`` ActionState records (default 500k) on a fresh embedded broker with
the journal codec and the store's key layout: per input record, call 0 SUCCEEDED, call 1
SUCCEEDED / FAILED / PENDING (94 / 4 / 2 %), an ActionDone unless a call is PENDING, and
for 5 % of inputs an earlier PENDING version of call 1 that compaction must discard; and
the app's input topic (one record per ActionState, at the offset its seq names) and output
topic (each ActionDone's output, once).

Then measures, and prints as a table with records/s and the ratio to a plain Spark read:

- python: one process, one consumer over every partition keeping the last value per key
  (tombstones delete), decoding every live value and computing the audit's journal
  figures (status counts, in-flight, stuck, failures by type) with dicts;
- plain spark read (the baseline): the ``agents_stream.kafka`` source over the same topic,
  every value's length summed (so values are read, not pruned), ``local[2]``;
- spark audit (``run_audit`` without the input/output joins): read, compact, decode and
  every journal table, Parquet and reports written; best of ``--repeat`` after a warm-up;
- spark audit with the input and output checks (the CLI's default: the journal joined
  with the input topic, for inputs without a completed ActionState, and with the output
  topic, for outputs sent more often than journaled), against a plain read of the three
  topics.

Both must agree on the figures (and the checks find nothing missing but the in-flight
ActionStates' inputs, and no duplicate); the script fails if they do not.

Run: ``.venv/bin/python bench/bench_spark_audit.py [--quick] [--records N] [--master local[2]]``
(``--quick``: 100k records, what ``make bench`` runs).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from common import parser as bench_parser
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from agents_stream import Agent, App, InputEvent, RunnerContext, action
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark import get_spark, read_kafka
from agents_stream.spark.jobs.audit import run_audit
from agents_stream.testing import EmbeddedBroker


class Bench(Agent):
    """The agent whose journal is audited (its actions are never run here)."""

    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        return None


PARTITIONS = 4
APP = App("bench-audit", prune_completed=False, partitions=PARTITIONS)
APP.agent(Bench, input="bench-audit-in", output="bench-audit-out")
TOPIC = APP.action_state_topic
INPUT, OUTPUT = "bench-audit-in", "bench-audit-out"
NOW_MS = 1_800_000_000_000
ACTION = "Bench.process#0"


def _key(i: int) -> str:
    return f"key-{i % 5000}"


def _output(i: int) -> bytes:
    return b'{"i":%d}' % i


def _entries(i: int):
    # Input record i sits at offset i // PARTITIONS of partition i % PARTITIONS.
    ref = ActionRef(_key(i), i // PARTITIONS, ACTION, i % PARTITIONS)
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
    out.append(ActionDone(ref, outputs=(_output(i),), calls=2, finished_ms=started + 10))
    return out


def generate(bootstrap: str, records: int) -> tuple[int, int]:
    """Journal records, and the app's input and output records; how many of each."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(t, PARTITIONS, 1) for t in (TOPIC, INPUT, OUTPUT)]
    for future in admin.create_topics(topics).values():
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

    def send(topic: str, key: bytes, value: bytes, partition: int) -> None:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition)
                return
            except BufferError:
                producer.poll(0.05)

    n = i = topic_records = 0
    while n < records:
        entries = _entries(i)
        # The input record of ActionState i, then its output if it completed.
        send(INPUT, _key(i).encode(), b'{"n":%d}' % i, i % PARTITIONS)
        topic_records += 1
        if isinstance(entries[-1], ActionDone):
            send(OUTPUT, _key(i).encode(), _output(i), i % PARTITIONS)
            topic_records += 1
        for entry in entries:
            send(TOPIC, entry_key_bytes(entry), codec.encode(entry), entry.ref.partition)
            n += 1
        i += 1
        if i % 20_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0, "records left unsent"
    return n, topic_records


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
        total, topic_records = generate(broker.bootstrap, args.records)
        gen_s = time.perf_counter() - t0
        print(
            f"generated {total:,} ActionState records and {topic_records:,} input and "
            f"output records in {gen_s:.1f}s"
        )
        t0 = time.perf_counter()
        expected = python_pass(broker.bootstrap, stuck_after_s * 1000)
        py_s = time.perf_counter() - t0
        spark = get_spark("bench-spark-audit", master=args.master)
        out = tempfile.mkdtemp(prefix="bench-audit-")
        journal = read_kafka(spark, broker.bootstrap, TOPIC)
        topics = read_kafka(spark, broker.bootstrap, [TOPIC, INPUT, OUTPUT])

        def best_of(repeat: int, fn: Callable[[], object]) -> float:
            fn()  # warm-up: the Python workers, the codec, the plan
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            return best

        def plain(frame: DataFrame) -> Callable[[], object]:
            return lambda: frame.select(F.sum(F.length("value"))).collect()[0][0]

        audits: list[dict[str, Any]] = []

        def audit(checks: bool) -> Callable[[], object]:
            kwargs: dict[str, Any] = dict(
                stuck_after_s=stuck_after_s, now_ms=NOW_MS, inputs=checks, outputs=checks
            )
            return lambda: audits.append(
                run_audit(spark, APP, broker.bootstrap, out, **kwargs).summary
            )

        plain_s = best_of(max(args.repeat, 2), plain(journal))
        audit_s = best_of(args.repeat, audit(False))
        plain_all_s = best_of(max(args.repeat, 2), plain(topics))
        checked_s = best_of(args.repeat, audit(True))
        spark.stop()
    for summary in audits:
        for name, value in expected.items():
            assert summary[name] == value, f"{name}: spark {summary[name]} != python {value}"
    checked = audits[-1]
    # Inputs without a completed ActionState: those of the in-flight ones (no offsets
    # are committed here); every output is journaled once.
    assert checked["inputs_missing_state"] == expected["in_flight_action_states"], checked
    assert checked["duplicate_output_records"] == 0, checked
    print(f"\n{'method':<52}{'records':>10}{'seconds':>10}{'records/s':>12}{'vs plain':>10}")
    everything = total + topic_records
    for name, records, secs, baseline in (
        (f"plain spark read {args.master} (baseline)", total, plain_s, plain_s),
        ("python single process (read+decode+count)", total, py_s, plain_s),
        (f"spark audit {args.master} (all tables+reports)", total, audit_s, plain_s),
        ("plain read of journal, input, output (baseline)", everything, plain_all_s, plain_all_s),
        ("spark audit + input/output checks (CLI default)", everything, checked_s, plain_all_s),
    ):
        print(
            f"{name:<52}{records:>10,}{secs:>10.2f}{records / secs:>12,.0f}{baseline / secs:>9.2f}x"
        )
    print(f"\nfigures (identical in both): {expected}")
    print(
        f"checks: {checked['inputs_missing_state']:,} inputs without a completed "
        f"ActionState, {checked['duplicate_output_records']} duplicate outputs"
    )
    print(f"report: {out}/report.html")


if __name__ == "__main__":
    main()
