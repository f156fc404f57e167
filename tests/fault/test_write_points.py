"""A SIGKILL at each write point of completion groups (journal v7), then a restart.

A worker drains 40 inputs of a sync action with two journaled calls each (their starts
and acknowledgements recorded in a SQLite ledger, tests/apps/zombie_app.py), records of
one lane round completing as one CompletionGroup. It is stopped at one point
(``agents_stream/durable/faultpoints.py``), SIGKILLed there, and started again:

- ``outputs``: a group's completion acknowledged, its outputs not produced: the next
  worker finds every member's ActionDone and sends the outputs once, running nothing;
- ``commit``: records finished (outputs acknowledged), offsets and markers not written:
  re-consumed, their actions are skipped and their outputs found in the log, not sent
  again;
- ``prune``: offsets and markers durable, the journal not pruned: the records are below
  the completed-through marker; the groups they left are tombstoned on assignment.

Each time: every input's output exactly once, no acknowledged call started again, and,
once the restarted worker has committed, no completion group left in the journal (and,
but after ``prune``, no ActionDone: a record's own entries left by a crash between a
commit and its prune stay, as before v7); the restarted worker alive with no CRITICAL
line.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter

import pytest

from agents_stream.cli.state_read import read_latest
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.fault.fleet import assert_survivors
from tests.fault.scenario import wait_log

pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.kafka_proof]

APP = "tests.apps.zombie_app:app"
INPUTS = 40


@pytest.mark.parametrize("point", ["outputs", "commit", "prune"])
def test_sigkill_at_a_write_point_then_restart(
    point, broker, topic_factory, worker_factory, tmp_path
):
    faults = tmp_path / "faults"
    faults.mkdir()
    ledger = tmp_path / "ledger.sqlite"
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_LEDGER": str(ledger),
        "AS_CALL_S": "0",
        "AS_COMMIT_INTERVAL": "0.3",
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=2)
    produce(broker.bootstrap, env["AS_INPUT"], [(f"k{n % 8}", {"n": n}) for n in range(INPUTS)])
    armed = {"AGENTS_STREAM_FAULT_POINTS": point, "AGENTS_STREAM_FAULT_DIR": str(faults)}
    victim = worker_factory(APP, {**env, **armed})
    parked = faults / f"parked-{point}"
    deadline = time.monotonic() + 90
    while not parked.exists():
        assert victim.alive and time.monotonic() < deadline, victim.log()
        time.sleep(0.05)
    time.sleep(0.3)  # what was in flight when the point was reached gets its acks
    victim.kill()
    first_pid = int(parked.read_text())

    restarted = worker_factory(APP, env)
    wait_log(restarted, "assigned", timeout=90)
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], INPUTS, timeout=90)
    state_topic = f"{env['AS_APP_ID']}-action-state"
    deadline = time.monotonic() + 60
    while True:  # every record committed and pruned: nothing of their completion left
        live = read_latest(broker.bootstrap, state_topic, timeout=30)
        # After ``prune``, records' own entries (an ActionDone written alone, calls) are
        # left as before v7: only the holder that finished a record prunes it, and after
        # a restart a dead letter's kept journal cannot be told from them. Groups not.
        kinds = (b"g\x1f",) if point == "prune" else (b"g\x1f", b"a\x1f")
        left = sorted(k for k in live if k[:2] in kinds)
        if not left:
            break
        assert time.monotonic() < deadline, f"left in the journal: {left[:5]} ({len(left)})"
        time.sleep(0.5)
    outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
    by_n = Counter(r.json()["n"] for r in outputs)
    assert by_n == dict.fromkeys(range(INPUTS), 1), sorted(n for n, c in by_n.items() if c != 1)

    db = sqlite3.connect(ledger)
    rows = db.execute("SELECT what, pid, n, i, id FROM calls").fetchall()
    acked = {(n, i): row_id for what, pid, n, i, row_id in rows if what == "acked"}
    again = [
        (n, i)
        for what, pid, n, i, row_id in rows
        if what == "start" and (n, i) in acked and row_id > acked[(n, i)]
    ]
    assert not again, f"acknowledged calls started again: {again}"
    started = Counter((n, i) for what, _, n, i, _ in rows if what == "start")
    assert set(started) == {(n, i) for n in range(INPUTS) for i in range(2)}
    assert any(pid == first_pid for _, pid, *_ in rows)  # the victim did work
    assert_survivors([restarted])
