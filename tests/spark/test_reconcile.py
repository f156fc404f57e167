"""``spark reconcile``: a PENDING slot left by a SIGKILLed worker is settled from a
ledger; the restarted worker replays the ledger's result, running neither the function
nor the reconciler."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.payload import JSON
from agents_stream.spark.jobs.reconcile import NOT_IN_LEDGER, Ledger, decide, run_reconcile
from tests.apps.effects import connect
from tests.spark.workload import APP_SPEC, SparkAppEnv, wait_until

PENDING = CallEntry(
    ActionRef("k", 3, "A.a#0"),
    0,
    "f",
    "d",
    CallStatus.PENDING,
    call_id="app:k:3:A.a#0:0",
    started_ms=5,
    attempts=2,
    worker_id="w1",
)


def test_decide_settles_from_the_ledger_row():
    ok = decide(PENDING, {"ledger_id": "x", "ledger_result": '{"a": 1}'}, codec=JSON, now_ms=9)
    assert ok is not None and ok.status is CallStatus.SUCCEEDED
    assert JSON.decode(ok.result) == {"a": 1}
    assert (ok.call_id, ok.started_ms, ok.attempts, ok.finished_ms) == (PENDING.call_id, 5, 2, 9)
    failed = decide(
        PENDING,
        {
            "ledger_id": "x",
            "ledger_status": "failed",
            "ledger_error_type": "builtins.LookupError",
            "ledger_error_message": "declined",
        },
        codec=JSON,
    )
    assert failed is not None and failed.status is CallStatus.FAILED
    assert (failed.exception.type, failed.exception.message) == ("builtins.LookupError", "declined")
    assert decide(PENDING, None, codec=JSON) is None
    absent = decide(PENDING, None, codec=JSON, missing="fail")
    assert absent is not None and absent.exception.type == NOT_IN_LEDGER


@pytest.mark.broker
@pytest.mark.spark
def test_reconciled_slot_is_replayed_by_the_restarted_worker(
    spark, broker, topic_factory, worker_factory, tmp_path
):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    (env.latch / "park-in-charge").write_text("")
    env.send([("c50", {"n": 50, "scenario": "charge"})])
    worker = worker_factory(APP_SPEC, env.env)
    wait_until(lambda: (env.latch / "parked-in-charge").exists() or not worker.alive)
    assert worker.alive, worker.log()
    worker.kill()  # PENDING acked, the charge happened, its result was never journaled
    (env.latch / "park-in-charge").unlink()
    db = connect(str(env.db_path))
    [(call_id,)] = db.execute("SELECT call_id FROM effects WHERE kind = 'charge'").fetchall()
    db.close()

    ledger = tmp_path / "ledger.parquet"
    pd.DataFrame(
        {
            "call_id": [call_id, "other:call"],
            "status": ["SUCCEEDED", "SUCCEEDED"],
            "result": [json.dumps({"charged": 50, "by": "ledger"}), "{}"],
        }
    ).to_parquet(ledger)
    started = time.monotonic()
    result = run_reconcile(
        spark, env.app(), broker.bootstrap, Ledger(str(ledger)), out_dir=tmp_path / "rec"
    )
    assert result.summary["pending"] == 1
    assert result.summary["succeeded"] == result.summary["written"] == 1
    [decision] = result.decisions
    assert decision["call_id"] == call_id and decision["decision"] == "SUCCEEDED"
    assert time.monotonic() - started < 120

    worker_factory(APP_SPEC, env.env)
    [out] = env.outputs(1)
    assert out.json() == {"n": 50, "charge": {"charged": 50, "by": "ledger"}}
    assert env.effects() == {"charge": 1}  # neither the function nor the reconciler ran again
