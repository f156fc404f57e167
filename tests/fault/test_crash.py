"""Guarantees 1-4 of DESIGN.md, proven by SIGKILLing a worker subprocess at a precise
point (the action parks on a file latch once the journal record is acked), restarting it
and counting the side effects recorded in SQLite."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from agents_stream.testing.topics import read_topic
from tests.apps.crashy import rich_value, shape
from tests.fault.scenario import CrashScenario, wait_log

# Guarantee proofs: on Apache Kafka only when both brokers run (tests/conftest.py).
pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.kafka_proof]

APP = "tests.apps.crashy:app"


@pytest.fixture
def crash(broker, topic_factory, worker_factory, tmp_path):
    return CrashScenario(broker, topic_factory, tmp_path, lambda env: worker_factory(APP, env))


# uvloop is the worker's default loop; the stdlib loop (AGENTS_STREAM_EVENT_LOOP=asyncio)
# must keep the same guarantee.
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_acked_calls_are_not_executed_again(crash, loop):
    crash.arm("after-1")
    crash.send({"scenario": "calls", "n": 7})
    worker = crash.start(AGENTS_STREAM_EVENT_LOOP=loop)
    crash.wait_parked("after-1", worker)  # calls 0 and 1 journaled and acked
    worker.kill()
    crash.disarm("after-1")
    restarted = crash.start(AGENTS_STREAM_EVENT_LOOP=loop)
    [out] = crash.outputs(1)
    assert out["results"] == ["fetch-7", "score-7", "notify-7"]
    assert crash.effects() == {"fetch": 1, "score": 1, "notify": 1}
    assert restarted.terminate() == 0
    assert "calls_replayed=2" in restarted.log()
    assert f"(event loop {loop}, GIL switch 200 us)" in restarted.log()


def test_b_pending_slot_is_reconciled_not_re_executed(crash):
    crash.arm("in-charge")
    crash.send({"scenario": "reconcile", "n": 50})
    worker = crash.start()
    crash.wait_parked("in-charge", worker)  # PENDING acked, money moved, result not journaled
    worker.kill()
    crash.disarm("in-charge")
    crash.start()
    [out] = crash.outputs(1)
    assert out["charge"] == {"charged": 50, "by": "reconciler"}
    assert crash.effects() == {"charge": 1, "reconcile": 1}


def test_b_zero_argument_reconciler_runs_after_a_crash(crash):
    crash.arm("in-charge")
    crash.send({"scenario": "reconcile-zero", "n": 60})
    worker = crash.start()
    crash.wait_parked("in-charge", worker)  # PENDING acked, money moved, result not journaled
    worker.kill()
    crash.disarm("in-charge")
    crash.start()
    [out] = crash.outputs(1)
    assert out["charge"] == {"charged": 60, "by": "reconciler"}
    assert crash.effects() == {"charge": 1, "reconcile": 1}


def test_c_journaled_exception_is_reraised_without_running(crash):
    crash.arm("after-failure")
    crash.send({"scenario": "exception", "n": 3})
    worker = crash.start()
    crash.wait_parked("after-failure", worker)
    worker.kill()
    crash.disarm("after-failure")
    crash.start()
    [out] = crash.outputs(1)
    assert out["caught"] == "ValueError: declined 3"
    assert crash.effects() == {"failing": 1}


def test_d_changed_call_order_truncates_and_re_executes(crash):
    crash.arm("reorder-1")
    crash.send({"scenario": "reorder", "n": 1})
    worker = crash.start(AS_VARIANT="v1")
    crash.wait_parked("reorder-1", worker)  # A and B journaled
    worker.kill()
    crash.disarm("reorder-1")
    restarted = crash.start(AS_VARIANT="v2")  # the new deploy calls A, C, B
    [out] = crash.outputs(1)
    assert out["results"] == ["A-1", "C-1", "B-1"]
    # A replayed; slot 1 (B) mismatched C: truncated, C executed, B executed again
    assert crash.effects() == {"A": 1, "B": 2, "C": 1}
    restarted.terminate()
    log = restarted.log()
    assert "non-deterministic replay" in log and "call_index=1" in log


def test_e_completed_action_is_skipped_and_memory_applied_once(crash):
    crash.arm("second")
    crash.send({"scenario": "two-actions", "n": 4})
    worker = crash.start()
    crash.wait_parked("second", worker)  # first action completed, second in flight
    worker.kill()
    crash.disarm("second")
    restarted = crash.start()
    [out] = crash.outputs(1)
    assert out == {"n": 4, "first": "first-4", "second": "second-4", "count": 1}
    assert crash.effects() == {"first": 1, "second": 1}
    restarted.terminate()
    assert "actions_skipped=1" in restarted.log()


def test_e_completed_record_re_consumed_is_skipped_without_duplicate_output(crash):
    crash.send({"scenario": "calls", "n": 9})
    worker = crash.start(AS_COMMIT_INTERVAL="3600")  # finishes but never commits
    crash.outputs(1)
    time.sleep(0.5)  # let the emitted marker be acked too
    worker.kill()
    restarted = crash.start()
    wait_log(restarted, "assigned")
    time.sleep(2)
    assert restarted.terminate() == 0
    assert "actions_skipped=1" in restarted.log(), restarted.log()
    assert crash.effects() == {"fetch": 1, "score": 1, "notify": 1}
    assert len(read_topic(crash.broker.bootstrap, crash.env["AS_OUTPUT"])) == 1


def test_g7_replayed_values_keep_their_types_in_a_new_process(crash):
    """Guarantee 7 through Kafka, RocksDB and Avro, not an in-memory store: a result from
    every corner of the value domain, a call taking it as its argument and a journaled
    exception, all acked before the kill. The restarted process hashes strings
    differently (another PYTHONHASHSEED), so a digest or a set that depended on it would
    show up as a re-executed call or a changed shape."""
    crash.arm("values")
    crash.send({"scenario": "values", "n": 9})
    worker = crash.start(PYTHONHASHSEED="1")
    crash.wait_parked("values", worker)  # all three CallResults acked
    worker.kill()
    crash.disarm("values")
    restarted = crash.start(PYTHONHASHSEED="2")
    [out] = crash.outputs(1)
    expected = shape(rich_value(9))
    assert out["value"] == expected  # replayed in the new process
    assert out["used"] == expected  # computed by the first one, journaled
    assert out["error"] == shape((Decimal("2.50"), (9, "x"), {1: b"\x00"}))
    assert crash.effects() == {"rich": 1, "use": 1, "refuse": 1}
    assert restarted.terminate() == 0
    assert "calls_replayed=3" in restarted.log()
