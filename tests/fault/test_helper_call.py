"""Guarantee 1 for a sync action whose ``ctx.execute`` is in a helper function: the
action names no call, so its first record runs without a carrier greenlet and the call
blocks the loop until acknowledged; its later records run in a carrier (learned). Either
way an acknowledged call is replayed after a SIGKILL, never run again."""

from __future__ import annotations

import time

import pytest

from agents_stream.testing.topics import read_topic
from tests.apps.effects import REEXECUTED_AFTER_ACK, connect
from tests.fault.fleet import assert_survivors
from tests.fault.scenario import CrashScenario

pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.kafka_proof]

APP = "tests.apps.helper_call_app:app"
WARNING = "ran outside the action's carrier and blocked the event loop"


@pytest.fixture
def crash(broker, topic_factory, worker_factory, tmp_path):
    return CrashScenario(broker, topic_factory, tmp_path, lambda env: worker_factory(APP, env))


def test_a_call_through_a_helper_is_replayed_not_run_again(crash):
    # 40 records run first; a later one parks after its call is acked. A 60 s commit
    # interval: nothing is committed before the kill, so every record is consumed again.
    crash.env["AS_COMMIT_INTERVAL"] = "60"
    crash.send(*({"n": n} for n in range(40)))
    crash.arm("after-call")
    worker = crash.start()
    first = crash.outputs(40)
    assert sorted(o["n"] for o in first) == list(range(40))
    crash.send({"n": 99, "park": True})
    crash.wait_parked("after-call", worker)  # its call journaled and acknowledged
    log = worker.log()
    assert log.count(WARNING) == 1, log  # the first record only: then learned
    worker.kill()
    crash.disarm("after-call")
    restarted = crash.start()
    deadline = time.monotonic() + 90
    outputs = crash.outputs(41)
    while 99 not in {o["n"] for o in outputs}:  # a re-sent output may come first
        assert restarted.alive and time.monotonic() < deadline, restarted.log()
        time.sleep(0.3)
        outputs = [r.json() for r in read_topic(crash.broker.bootstrap, crash.env["AS_OUTPUT"])]
    assert {o["n"] for o in outputs} == {*range(40), 99}
    assert all(o["charged"] == o["n"] for o in outputs)
    # Every call ran once: the 41 acknowledged ones were replayed by the restarted worker.
    assert crash.effects() == {"charge": 41}
    db = connect(str(crash.db_path))
    assert db.execute(REEXECUTED_AFTER_ACK).fetchone() == (0,)
    db.close()
    # Replays make no call, so nothing blocked the restarted worker's loop.
    assert WARNING not in restarted.log()
    assert_survivors([restarted])
    assert restarted.terminate() == 0
