"""``spark audit`` against a workload with known stuck, failed, truncated, missing and
duplicated cases (worker-produced plus crafted journal records)."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from agents_stream.spark.jobs.audit import run_audit
from agents_stream.testing.topics import read_topic
from tests.spark.workload import APP_SPEC, SparkAppEnv, craft_anomalies, normal_inputs

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_audit_counts_known_anomalies(spark, broker, topic_factory, worker_factory, tmp_path):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    env.send(
        [
            *normal_inputs(6),
            ("f0", {"n": 100, "scenario": "fail"}),
            ("f1", {"n": 101, "scenario": "fail"}),
        ]
    )
    worker = worker_factory(APP_SPEC, env.env)
    outputs = env.outputs(8)
    time.sleep(1.0)  # let the worker commit the processed offsets
    assert worker.terminate() == 0, worker.log()

    now_ms = int(time.time() * 1000)
    craft_anomalies(env, now_ms)
    env.send([("late-a", {"n": 200}), ("late-b", {"n": 201}), ("late-c", {"n": 202})])
    dup = outputs[0]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for _ in range(2):  # the same output emitted twice more: 2 duplicate records
        producer.produce(env.output, value=dup.value, key=dup.key.encode())
    assert producer.flush(30) == 0
    assert len(read_topic(broker.bootstrap, env.output)) == 10

    out = tmp_path / "audit"
    result = run_audit(spark, env.app(), broker.bootstrap, out, stuck_after_s=300, now_ms=now_ms)
    s = result.summary
    assert s["action_states"] == 6 * 2 + 2 + 3
    assert s["completed_action_states"] == 6 * 2 + 2 + 1
    assert s["in_flight_action_states"] == 2
    assert (s["calls_succeeded"], s["calls_failed"], s["calls_pending"]) == (12, 3, 2)
    assert s["stuck_calls"] == 1
    assert s["truncations"] == 1
    assert s["undecodable_records"] == 1
    assert s["inputs_missing_state"] == 3
    assert s["inputs_missing_state_uncommitted"] == 3
    assert (s["duplicate_output_groups"], s["duplicate_output_records"]) == (1, 2)

    [stuck] = result.tables["stuck"].collect()
    assert (stuck["key"], stuck["seq"], stuck["call_id"]) == (
        "s1",
        1000,
        f"{env.app_id}:s1:1000:Pipeline.process#0:0",
    )
    failures = {r["exception_type"]: r["calls"] for r in result.tables["failures"].collect()}
    assert failures == {"builtins.ValueError": 2, "builtins.TimeoutError": 1}
    missing = sorted(r["key"] for r in result.tables["missing_inputs"].collect())
    assert missing == ["late-a", "late-b", "late-c"]
    [dup_row] = result.tables["duplicate_outputs"].collect()
    assert (dup_row["key"], dup_row["records"], dup_row["expected"]) == (dup.key, 3, 1)

    assert json.loads((out / "summary.json").read_text()) == s
    assert spark.read.parquet(str(out / "stuck")).count() == 1
    page = (out / "report.html").read_text()
    assert "<svg" in page and "Pipeline.process SUCCEEDED" in page
    assert "## stuck (1)" in (out / "report.md").read_text()
