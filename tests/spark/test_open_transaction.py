"""A transaction held open while the source and each Spark job read ``read_committed``.

Exactly-once workers almost always have a transaction open, and an exactly-once app's
jobs read ``read_committed`` (docs/operations.md). A ``read_committed`` reader stops at
the last stable offset, where the open transaction begins; ranges planned to the high
watermark failed with "partition ends at N, before the planned end M". Here a
confluent-kafka transactional producer begins, writes to the input, ActionState and
output topics, and neither commits nor aborts until the source, the journal readers,
``audit``, ``backfill`` and ``reconcile`` have read: each completes and sees exactly the
committed records.

Kafka only: the embedded broker's offset lookups are not isolating.
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from agents_stream import App
from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import default_journal_codec
from agents_stream.spark import read_kafka
from agents_stream.spark.frames.action_state import read_journal
from agents_stream.spark.jobs.audit import run_audit
from agents_stream.spark.jobs.backfill import run_backfill
from agents_stream.spark.jobs.reconcile import Ledger, run_reconcile
from agents_stream.spark.source import plan_ranges
from agents_stream.testing.topics import create_topics
from tests.apps.spark_app import Pipeline
from tests.spark.workload import PROCESS, SparkAppEnv, craft_anomalies, normal_inputs

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.kafka_only]

COMMITTED = {"kafka.isolation.level": "read_committed"}


def _open_transaction(bootstrap: str, app: App, env: SparkAppEnv) -> Producer:
    """Begins a transaction writing an input, a PENDING call and an output to both
    partitions of each topic, and leaves it open."""
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{app.id}-open"})
    tx.init_transactions(30)
    tx.begin_transaction()
    codec = default_journal_codec()
    for p in (0, 1):
        ref = ActionRef(f"open{p}", 2000 + p, PROCESS, p)
        pending = CallEntry(
            ref, 0, "tests.apps.spark_app.enrich", "d" * 16, CallStatus.PENDING,
            call_id=ref.call_id(app.id, 0), started_ms=1, worker_id="w-open",
        )  # fmt: skip
        tx.produce(
            app.action_state_topic, key=entry_key_bytes(pending), value=codec.encode(pending),
            partition=p,
        )  # fmt: skip
        tx.produce(env.input, key=f"open{p}".encode(), value=b'{"n": 99}', partition=p)
        tx.produce(env.output, key=f"open{p}".encode(), value=b'{"open": true}', partition=p)
    tx.flush(30)
    return tx


def test_reads_and_jobs_stop_at_the_last_stable_offset(spark, broker, topic_factory, tmp_path):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    app = App(env.app_id, prune_completed=False, partitions=2, processing_guarantee="exactly_once")
    app.agent(Pipeline, input=env.input, output=env.output)
    create_topics(broker.bootstrap, [env.output], partitions=2)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    state = NewTopic(app.action_state_topic, 2, 1, config={"cleanup.policy": "compact"})
    for fut in admin.create_topics([state]).values():
        fut.result(timeout=30)
    env.send(normal_inputs(6))
    now_ms = int(time.time() * 1000)
    craft_anomalies(env, now_ms)  # 2 PENDING calls (1 stuck), a failure, a truncation...
    tx = _open_transaction(broker.bootstrap, app, env)
    took: dict[str, float] = {}
    clock = time.monotonic()

    def lap(step: str) -> None:
        nonlocal clock
        took[step] = time.monotonic() - clock
        clock = time.monotonic()

    try:
        # The source: ranges end where the transaction begins, and no task waits there.
        ends = {r.partition: r.end for r in plan_ranges(broker.bootstrap, env.input, **COMMITTED)}
        highs = {r.partition: r.end for r in plan_ranges(broker.bootstrap, env.input)}
        assert all(ends[p] < highs[p] for p in ends), (ends, highs)
        inputs = read_kafka(spark, broker.bootstrap, env.input, **COMMITTED)
        assert sorted(r.value for r in inputs.select("value").collect()) == sorted(
            json.dumps(v).encode() for _, v in normal_inputs(6)
        )
        assert read_kafka(spark, broker.bootstrap, env.input).count() == 8  # uncommitted: all
        lap("source")

        # The journal source, as reconcile and audit read it.
        journal = read_journal(spark, broker.bootstrap, app, **COMMITTED)
        keys = {r.key for r in journal.select("key").collect()}
        assert "s1" in keys and not keys & {"open0", "open1"}
        lap("journal readers")

        audit = run_audit(spark, app, broker.bootstrap, None, stuck_after_s=300, now_ms=now_ms)
        assert audit.summary["calls_pending"] == 2  # the open transaction's are not there
        assert audit.summary["stuck_calls"] == 1
        lap("audit")

        backfill = run_backfill(spark, app, broker.bootstrap, output_path=tmp_path / "out")
        assert backfill.summary["records"] == 6
        assert backfill.summary["errors"] == 0
        lap("backfill")

        ledger = tmp_path / "ledger.parquet"
        pd.DataFrame({"call_id": ["none"], "result": ["{}"]}).to_parquet(ledger)
        reconcile = run_reconcile(spark, app, broker.bootstrap, Ledger(str(ledger)), dry_run=True)
        assert reconcile.summary["pending"] == 2
        assert {d["key"] for d in reconcile.decisions} == {"s1", "s2"}
        lap("reconcile")
    finally:
        tx.abort_transaction(30)
    print(
        "\nopen transaction on input, journal and output: source, journal readers, audit, "
        "backfill, reconcile read committed records only ("
        + ", ".join(f"{k} {v:.1f}s" for k, v in took.items())
        + ")"
    )
