"""A dead letter replayed to its input (``x-replay-of``) through a real Faust worker runs
under its original offset: the call journaled before the failure is replayed, not
executed again, because the Faust host kept the dead letter's journal."""

from __future__ import annotations

import time

import pytest

from agents_stream.cli.dlq import read_dead_letters, replay
from agents_stream.testing.topics import wait_for_records
from tests.fault.scenario import CrashScenario

pytest.importorskip("faust")

pytestmark = [pytest.mark.broker, pytest.mark.fault]


@pytest.fixture
def scenario(broker, topic_factory, faust_factory, tmp_path):
    env = {"AS_BROKER": broker.url, "AS_DATA_DIR": str(tmp_path / "data")}
    return CrashScenario(
        broker, topic_factory, tmp_path, lambda e: faust_factory("tests.faust.app", e), env=env
    )


def test_replayed_dead_letter_replays_the_calls_of_its_first_attempt(scenario):
    bootstrap = scenario.broker.bootstrap
    source, dlq = scenario.env["AS_INPUT"], f"{scenario.env['AS_INPUT']}-dlq"
    scenario.send({"n": 4, "fail_after_fetch": True})
    proc = scenario.start()
    wait_for_records(bootstrap, dlq, 1)
    time.sleep(4)  # past a commit and a prune round: the dead letter's journal must stay
    assert proc.terminate() == 0
    assert scenario.effects() == {"fetch": 1}

    assert replay(bootstrap, source, read_dead_letters(bootstrap, dlq)) == 1
    fixed = scenario.start(AS_FIXED="1")
    [out] = scenario.outputs(1)
    assert out == {"n": 4, "results": ["fetch-4", "score-4", "notify-4"], "count": 1}
    assert scenario.effects() == {"fetch": 1, "score": 1, "notify": 1}
    assert fixed.terminate() == 0
    assert "'calls_replayed': 1" in fixed.log(), fixed.log()
