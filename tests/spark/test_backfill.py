"""``spark backfill`` produces what the worker produces for the same inputs, both from an
empty journal (everything executes on executors) and from the worker's journal (every
action is skipped and its outputs replayed)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agents_stream.durable.output_identity import OUTPUT_HEADER
from agents_stream.spark.jobs.backfill import run_backfill
from agents_stream.testing.topics import read_topic
from tests.spark.workload import APP_SPEC, SparkAppEnv, normal_inputs

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _multiset(pairs) -> Counter:
    return Counter((key, json.dumps(json.loads(value), sort_keys=True)) for key, value in pairs)


def test_backfill_equals_worker_output(spark, broker, topic_factory, worker_factory, tmp_path):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    env.send([*normal_inputs(9), ("f0", {"n": 100, "scenario": "fail"})])
    worker = worker_factory(APP_SPEC, env.env)
    worker_records = env.outputs(10)
    worker_out = _multiset((r.key, r.value) for r in worker_records)
    worker_ids = {r.headers[OUTPUT_HEADER] for r in worker_records}
    assert worker.terminate() == 0, worker.log()
    app = env.app()

    fresh = run_backfill(
        spark, app, broker.bootstrap, app_id=topic_factory("fresh"), output_path=tmp_path / "out"
    )
    assert fresh.summary["records"] == 10
    assert fresh.summary["calls_executed"] == 9 * 2 + 1
    assert fresh.summary["actions_run"] == 9 * 2 + 1
    assert fresh.summary["errors"] == 0
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert _multiset((r["key"], r["value"]) for r in rows) == worker_out
    # Each output has its identity (under the backfill's own app id here).
    ids = [r["output_id"] for r in rows]
    assert len(set(ids)) == len(rows) and all(
        i.startswith(f"{fresh.summary['app_id']}/") for i in ids
    )

    out_topic = topic_factory("bf-out")
    # The worker committed every input: only an explicit re-run reaches the journal.
    replayed = run_backfill(
        spark, app, broker.bootstrap, output_topic=out_topic, rerun_completed=True
    )
    assert replayed.summary["calls_executed"] == 0
    assert replayed.summary["actions_run"] == 0
    assert replayed.summary["actions_skipped"] == 9 * 2 + 1
    produced = read_topic(broker.bootstrap, out_topic)
    assert _multiset((r.key, r.value) for r in produced) == worker_out
    # Replayed from the worker's journal into another topic: the same identities as the
    # worker's outputs, so a consumer of both (or of a re-run) can dedupe.
    assert {r.headers[OUTPUT_HEADER] for r in produced} == worker_ids
    # Per-key order matches the worker's: the memory counter grows in input order.
    counts = [
        json.loads(r.value)["count"]
        for r in sorted(produced, key=lambda r: r.offset)
        if r.key == "k0"
    ]
    assert counts == [1, 2, 3]
