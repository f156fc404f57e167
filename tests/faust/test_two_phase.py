"""Two-phase calls on the Faust host: holds captured once Faust committed the order,
released when the action raises after its hold (dead-lettered), and a hold journaled
before a SIGKILL replayed by the restarted Faust worker, then captured once (an external
SQLite ledger, tests/apps/two_phase_app.py)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps.two_phase_app import connect
from tests.fault.fleet import critical_lines

pytest.importorskip("faust")

pytestmark = [pytest.mark.broker, pytest.mark.fault]

MODULE = "tests.faust.two_phase_app"


def test_holds_captured_released_and_replayed_after_sigkill(
    broker, topic_factory, faust_factory, tmp_path
):
    latches = tmp_path / "latches"
    latches.mkdir()
    ledger = tmp_path / "ledger.sqlite"
    connect(str(ledger)).close()
    env = {
        "AS_BROKER": broker.url,
        "AS_DATA_DIR": str(tmp_path / "data"),
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_LEDGER": str(ledger),
        "AS_LATCH_DIR": str(latches),
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    orders = [{"order": f"o{n}", "fail": n == 2} for n in range(5)]
    produce(broker.bootstrap, env["AS_INPUT"], [(o["order"], o) for o in orders])
    (latches / "park-prepared-o4").touch()
    victim = faust_factory(MODULE, env)
    deadline = time.monotonic() + 120
    while not (latches / "parked-prepared-o4").exists():
        assert victim.alive and time.monotonic() < deadline, victim.log()
        time.sleep(0.1)
    time.sleep(0.5)
    victim.kill()
    (latches / "park-prepared-o4").unlink()

    restarted = faust_factory(MODULE, env)
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 4, timeout=120)
    db = sqlite3.connect(ledger, timeout=60)
    deadline = time.monotonic() + 90
    while True:
        states = dict(db.execute("SELECT orders, state FROM holds").fetchall())
        if len(states) == 5 and "HELD" not in states.values():
            break
        assert time.monotonic() < deadline, (states, restarted.log()[-3000:])
        time.sleep(0.3)
    assert states == {f"o{n}": "RELEASED" if n == 2 else "CAPTURED" for n in range(5)}
    assert db.execute("SELECT * FROM violations").fetchall() == []
    o4 = [w for (w,) in db.execute("SELECT what FROM attempts WHERE orders = 'o4'")]
    assert o4.count("hold") == 1  # journaled before the kill: replayed, not held again
    outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
    assert sorted(r.json()["order"] for r in outputs) == ["o0", "o1", "o3", "o4"]
    assert restarted.alive and not critical_lines(restarted), restarted.log()
