"""Guarantee 8 across hosts: after a healthy worker run committed and *pruned* its
inputs, ``spark backfill`` over the same range charges nothing (unless
``rerun_completed``) and ``spark audit`` reports no input as missing its state: both
read the InputProgress markers the worker wrote with its commits."""

from __future__ import annotations

import time

import pytest

from agents_stream.spark.jobs.audit import run_audit
from agents_stream.spark.jobs.backfill import run_backfill
from agents_stream.testing.topics import read_topic
from tests.spark.workload import APP_SPEC, SparkAppEnv, normal_inputs

pytestmark = [pytest.mark.broker, pytest.mark.spark]

N = 9


def _pruned(env: SparkAppEnv) -> bool:
    last: dict[str, bytes | None] = {}
    for r in sorted(
        read_topic(env.bootstrap, f"{env.app_id}-action-state"),
        key=lambda r: (r.partition, r.offset),
    ):
        last[r.key] = r.value
    kinds = {k.split("\x1f")[0] for k, v in last.items() if v is not None}
    return "p" in kinds and kinds <= {"m", "p"}


def test_backfill_and_audit_agree_with_the_worker_after_pruning(
    spark, broker, topic_factory, worker_factory, tmp_path
):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    env.env["AS_PRUNE"] = "1"
    env.send(normal_inputs(N))
    worker = worker_factory(APP_SPEC, env.env)
    env.outputs(N)
    deadline = time.monotonic() + 30
    while not _pruned(env) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _pruned(env)
    assert worker.terminate() == 0, worker.log()
    charged = env.effects()
    app = env.app()

    done = run_backfill(spark, app, broker.bootstrap)
    assert done.summary["records"] == N
    assert done.summary["inputs_completed"] == N == done.summary["skipped"]
    assert done.summary["calls_executed"] == 0
    assert done.summary["actions_run"] == 0
    assert env.effects() == charged

    audit = run_audit(spark, app, broker.bootstrap, tmp_path / "audit", stuck_after_s=300)
    assert audit.summary["inputs_missing_state"] == 0, audit.summary

    rerun = run_backfill(spark, app, broker.bootstrap, rerun_completed=True)
    assert rerun.summary["inputs_completed"] == 0
    assert rerun.summary["calls_executed"] == N * 2  # explicitly asked: charged again
