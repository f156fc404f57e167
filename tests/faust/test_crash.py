"""The Faust host keeps the worker's guarantees: a Faust worker running a durable agent is
SIGKILLed at a precise point (the action parks on a file latch once its calls are
journaled and acked), restarted, and the side effects recorded in SQLite are counted."""

from __future__ import annotations

import time

import pytest

from agents_stream.testing.topics import read_topic, wait_for_records
from tests.apps.effects import REEXECUTED_AFTER_ACK, connect
from tests.fault.scenario import CrashScenario, wait_log

pytest.importorskip("faust")

pytestmark = [pytest.mark.broker, pytest.mark.fault]

MODULE = "tests.faust.app"


@pytest.fixture
def scenario(broker, topic_factory, faust_factory, tmp_path):
    env = {"AS_BROKER": broker.url, "AS_DATA_DIR": str(tmp_path / "data")}
    return CrashScenario(
        broker, topic_factory, tmp_path, lambda e: faust_factory(MODULE, e), env=env
    )


def test_records_run_and_outputs_keep_the_key(scenario):
    scenario.send({"n": 1}, {"n": 2}, {"n": 3})
    proc = scenario.start()
    outs = scenario.outputs(3)
    assert sorted(o["n"] for o in outs) == [1, 2, 3]
    assert scenario.effects() == {"fetch": 3, "score": 3, "notify": 3}
    records = read_topic(scenario.broker.bootstrap, scenario.env["AS_OUTPUT"])
    assert {r.key for r in records} == {"key-1", "key-2", "key-3"}
    # Once Faust committed them, the records' ActionStates are tombstoned (pruned).
    state_topic = f"{scenario.env['AS_APP_ID']}-action-state"
    deadline = time.monotonic() + 30
    while not any(r.value is None for r in read_topic(scenario.broker.bootstrap, state_topic)):
        assert time.monotonic() < deadline, "ActionStates never pruned"
        time.sleep(0.5)
    assert proc.terminate() == 0


def test_acked_calls_are_replayed_after_sigkill(scenario):
    scenario.arm("after-1")
    scenario.send({"n": 7})
    proc = scenario.start()
    scenario.wait_parked("after-1", proc)  # calls 0 and 1 journaled and acked
    proc.kill()
    scenario.disarm("after-1")
    restarted = scenario.start()
    [out] = scenario.outputs(1)
    assert out == {"n": 7, "results": ["fetch-7", "score-7", "notify-7"], "count": 1}
    assert scenario.effects() == {"fetch": 1, "score": 1, "notify": 1}
    assert restarted.terminate() == 0
    assert "'calls_replayed': 2" in restarted.log(), restarted.log()


def test_records_in_flight_together_are_killed_and_replayed(scenario):
    """``concurrency=4``: several records of distinct keys are mid-way when the worker
    is SIGKILLed (one parked after its second call, blocking the loop, the others at
    whatever point they reached); after a restart every record's output is there once,
    its memory updated once, and no acknowledged call ran again."""
    scenario.arm("after-1")
    scenario.send(*({"n": n} for n in range(1, 9)))
    proc = scenario.start(AS_CONCURRENCY="4")
    scenario.wait_parked("after-1", proc)
    proc.kill()
    assert scenario.effects()["fetch"] >= 2  # more than one record was in flight
    scenario.disarm("after-1")
    restarted = scenario.start(AS_CONCURRENCY="4")
    scenario.outputs(8)
    time.sleep(2)  # a duplicate would arrive by now
    outs = [r.json() for r in read_topic(scenario.broker.bootstrap, scenario.env["AS_OUTPUT"])]
    assert sorted(o["n"] for o in outs) == list(range(1, 9))
    assert all(o["count"] == 1 for o in outs)
    assert connect(str(scenario.db_path)).execute(REEXECUTED_AFTER_ACK).fetchone()[0] == 0
    effects = scenario.effects()
    assert min(effects["fetch"], effects["score"], effects["notify"]) >= 8, effects
    assert restarted.terminate() == 0


def test_finished_but_uncommitted_record_is_skipped(scenario):
    scenario.send({"n": 9})
    proc = scenario.start(AS_COMMIT_INTERVAL="3600")  # finishes, Faust never commits
    scenario.outputs(1)
    time.sleep(0.5)  # let the emitted marker be acked too
    proc.kill()
    restarted = scenario.start()
    wait_log(restarted, "Steps: assigned")
    time.sleep(3)
    assert restarted.terminate() == 0
    log = restarted.log()
    assert "'actions_skipped': 1" in log, log
    assert scenario.effects() == {"fetch": 1, "score": 1, "notify": 1}
    outs = read_topic(scenario.broker.bootstrap, scenario.env["AS_OUTPUT"])
    assert len(outs) == 1
    assert outs[0].json()["count"] == 1  # memory update not applied twice


def test_failing_action_goes_to_dlq_and_the_stream_goes_on(scenario):
    scenario.send({"n": 1, "fail": True}, {"n": 2})
    proc = scenario.start()
    [out] = scenario.outputs(1)
    assert out["n"] == 2
    [dead] = wait_for_records(scenario.broker.bootstrap, f"{scenario.env['AS_INPUT']}-dlq", 1)
    assert dead.json() == {"n": 1, "fail": True}
    assert dead.headers["x-error-type"] == b"builtins.ValueError"
    assert proc.terminate() == 0


def test_on_error_fail_stops_the_worker_without_acking(scenario):
    scenario.send({"n": 1, "fail": True})
    proc = scenario.start(AS_ON_ERROR="fail")
    deadline = time.monotonic() + 60
    while proc.alive and time.monotonic() < deadline:
        time.sleep(0.2)
    log = proc.log()
    assert not proc.alive, log
    assert proc.proc.returncode != 0, log
    assert "declined 1" in log
    assert read_topic(scenario.broker.bootstrap, f"{scenario.env['AS_INPUT']}-dlq") == []
    # Not acked, so not committed: the next worker meets the record again.
    again = scenario.start(AS_ON_ERROR="fail")
    wait_log(again, "declined 1", timeout=90)
