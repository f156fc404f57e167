"""Two-phase calls through SIGKILLs and a rebalance, on Apache Kafka, both guarantees.

tests/apps/two_phase_app.py authorises a hold per order (``prepare``), captures it
(``commit``) or releases it (``abort``) in a SQLite ledger that outlives the workers;
an order with ``fail`` raises after its hold (dead-lettered). Asserted every time:

- every hold ends CAPTURED or RELEASED, never both (the ledger records a capture after
  a release, or the reverse, as a violation, whoever makes it);
- no capture before its record's completion is durable: each commit first reads the
  output topic read_committed and records a violation unless the order's output is in
  it;
- one hold per order: a preparation acknowledged before the kill is replayed, never
  prepared again;
- every output (read_committed) names a captured hold, every captured hold has its
  output, once; the failed order's hold is released and it is dead-lettered;
- the processes not killed are alive and logged no CRITICAL line.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agents_stream.cli.state_read import read_latest
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps.two_phase_app import connect
from tests.fault.fleet import assert_survivors
from tests.fault.scenario import wait_log

pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.kafka_proof]

APP = "tests.apps.two_phase_app:app"
GUARANTEES = ["at-least-once", "exactly-once"]


def _setup(broker, topic_factory, tmp_path: Path, orders: list[dict], partitions: int = 2):
    latches = tmp_path / "latches"
    latches.mkdir()
    ledger = tmp_path / "ledger.sqlite"
    connect(str(ledger)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_LEDGER": str(ledger),
        "AS_LATCH_DIR": str(latches),
        "AS_COMMIT_INTERVAL": "0.3",
        "AS_CHECK_OUTPUT": "1",  # each capture first looks its output up (read_committed)
        "AS_BOOTSTRAP": broker.bootstrap,
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=partitions)
    produce(broker.bootstrap, env["AS_INPUT"], [(o["order"], o) for o in orders])
    return env, latches, ledger


def _wait_parked(worker, parked: Path, timeout: float = 90) -> int:
    deadline = time.monotonic() + timeout
    while not parked.exists():
        assert worker.alive and time.monotonic() < deadline, worker.log()
        time.sleep(0.05)
    return int(parked.read_text())


def _wait_settled(ledger: Path, orders: int, timeout: float = 90) -> dict[str, set[str]]:
    """Every hold of every order ended (CAPTURED or RELEASED): order -> its holds' states."""
    db = sqlite3.connect(ledger, timeout=60)
    deadline = time.monotonic() + timeout
    while True:
        rows = db.execute("SELECT orders, state FROM holds").fetchall()
        states: dict[str, set[str]] = {}
        for order, state in rows:
            states.setdefault(order, set()).add(state)
        if len(states) >= orders and all("HELD" not in s for s in states.values()):
            return states
        assert time.monotonic() < deadline, f"holds not settled: {sorted(rows)}"
        time.sleep(0.2)


def _assert_ledger(broker, env, ledger: Path, orders: list[dict]) -> None:
    states = _wait_settled(ledger, len(orders))
    db = sqlite3.connect(ledger, timeout=60)
    assert db.execute("SELECT * FROM violations").fetchall() == []
    holds = db.execute("SELECT hold, orders, state FROM holds").fetchall()
    # One hold per order that completes. An order that raises after its hold may have
    # several: killed after its abort was decided, it runs again and prepares afresh
    # (round ~1), raises again, and that hold is released too.
    per_order = Counter(order for _, order, _ in holds)
    assert all(per_order[o["order"]] == 1 for o in orders if not o.get("fail")), per_order
    want = {o["order"]: {"RELEASED"} if o.get("fail") else {"CAPTURED"} for o in orders}
    assert states == want
    captured = {hold for hold, _, state in holds if state == "CAPTURED"}
    outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
    named = Counter(r.json()["hold"] for r in outputs)
    assert named == dict.fromkeys(captured, 1), named  # each output once, captured holds only
    if any(o.get("fail") for o in orders):
        dead = read_topic(broker.bootstrap, f"{env['AS_INPUT']}-dlq")
        assert len(dead) == sum(1 for o in orders if o.get("fail"))


def _args(guarantee: str) -> list[str]:
    return ["--processing-guarantee", guarantee]


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_sigkill_after_prepare_then_restart(
    guarantee, broker, topic_factory, worker_factory, tmp_path
):
    """Killed with a preparation journaled and its record not complete: the restarted
    worker replays the hold (prepares nothing again), then captures it once; an order
    that raises after its hold is released, never captured, and dead-lettered."""
    orders = [{"order": f"o{n}", "cents": 100 + n, "fail": n == 5} for n in range(10)]
    env, latches, ledger = _setup(broker, topic_factory, tmp_path, orders)
    (latches / "park-prepared-o3").touch()
    victim = worker_factory(APP, env, extra_args=_args(guarantee))
    first_pid = _wait_parked(victim, latches / "parked-prepared-o3")
    time.sleep(0.5)  # the others' journal writes get their acks
    victim.kill()
    (latches / "park-prepared-o3").unlink()

    restarted = worker_factory(APP, env, extra_args=_args(guarantee))
    wait_log(restarted, "assigned", timeout=90)
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], len(orders) - 1, timeout=90)
    _assert_ledger(broker, env, ledger, orders)
    db = sqlite3.connect(ledger, timeout=60)
    o3 = db.execute("SELECT what, pid FROM attempts WHERE orders = 'o3'").fetchall()
    assert [w for w, _ in o3].count("hold") == 1, o3  # journaled: replayed, not prepared again
    assert ("hold", first_pid) in o3
    assert ("capture", restarted.proc.pid) in o3  # the next owner captured it
    # Settled and committed: pruned, obligations included, but the dead letter's (its
    # journal is kept for its replay).
    state_topic = f"{env['AS_APP_ID']}-action-state"
    deadline = time.monotonic() + 60
    while True:
        live = read_latest(broker.bootstrap, state_topic, timeout=30)
        left = sorted(k.split(b"\x1f")[1] for k in live if k[:2] == b"x\x1f")
        if left == [b"o5"]:
            break
        assert time.monotonic() < deadline, f"obligations left: {left}"
        time.sleep(0.5)
    assert_survivors([restarted])


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_sigkill_inside_commit(guarantee, broker, topic_factory, worker_factory, tmp_path):
    """Killed inside a commit: the partition's next owner commits it again; the hold ends
    captured once, as every other."""
    orders = [{"order": f"o{n}", "cents": 200 + n} for n in range(6)]
    env, latches, ledger = _setup(broker, topic_factory, tmp_path, orders)
    (latches / "park-commit").touch()
    victim = worker_factory(APP, env, extra_args=_args(guarantee))
    first_pid = _wait_parked(victim, latches / "parked-commit")
    victim.kill()

    restarted = worker_factory(APP, env, extra_args=_args(guarantee))
    wait_log(restarted, "assigned", timeout=90)
    _assert_ledger(broker, env, ledger, orders)
    db = sqlite3.connect(ledger, timeout=60)
    # The victim parked before it captured anything of that hold; the restarted worker
    # captured every hold the victim had not.
    captures = db.execute("SELECT pid FROM attempts WHERE what = 'capture'").fetchall()
    assert (restarted.proc.pid,) in captures and first_pid != restarted.proc.pid
    assert_survivors([restarted])


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_rebalance_while_commits_wait(guarantee, broker, topic_factory, worker_factory, tmp_path):
    """Slow captures (1 s each) still waiting when a second worker joins and takes half
    the partitions: each hold is captured by one owner or the other, none twice-ended,
    every output once."""
    orders = [{"order": f"o{n}", "cents": 300 + n} for n in range(12)]
    env, _, ledger = _setup(broker, topic_factory, tmp_path, orders, partitions=4)
    env["AS_COMMIT_S"] = "1.0"
    first = worker_factory(APP, env, extra_args=_args(guarantee))
    db = sqlite3.connect(ledger, timeout=60)
    deadline = time.monotonic() + 90
    while not db.execute("SELECT 1 FROM attempts WHERE what = 'capture'").fetchone():
        assert first.alive and time.monotonic() < deadline, first.log()
        time.sleep(0.1)
    second = worker_factory(APP, env, extra_args=_args(guarantee))
    wait_log(second, "assigned", timeout=90)
    _assert_ledger(broker, env, ledger, orders)
    assert_survivors([first, second])


def test_dead_letter_replay_prepares_afresh(broker, topic_factory, worker_factory, tmp_path):
    """An order refused after its hold is dead-lettered and the hold released; once fixed,
    its dead-letter replay (run under its original offset) prepares a new hold (call id
    ``~1``) and captures it: the released hold is never captured."""
    orders = [{"order": f"o{n}", "cents": 400 + n, "fail": n == 1} for n in range(4)]
    env, latches, ledger = _setup(broker, topic_factory, tmp_path, orders)
    worker = worker_factory(APP, env)
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 3, timeout=90)
    [letter] = wait_for_records(broker.bootstrap, f"{env['AS_INPUT']}-dlq", 1, timeout=60)
    db = sqlite3.connect(ledger, timeout=60)
    deadline = time.monotonic() + 60
    while db.execute("SELECT count(*) FROM holds WHERE state = 'HELD'").fetchone()[0]:
        assert time.monotonic() < deadline, db.execute("SELECT * FROM holds").fetchall()
        time.sleep(0.2)
    [(first, state)] = db.execute("SELECT hold, state FROM holds WHERE orders = 'o1'")
    assert state == "RELEASED"
    (latches / "fixed").touch()
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "agents_stream", "dlq", "replay", "--all", "--yes",
         "-A", APP, "--broker", broker.url],
        env={**os.environ, **env}, cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "replayed 1" in done.stdout, done.stdout + done.stderr
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 4, timeout=90)
    deadline = time.monotonic() + 60
    while True:
        holds = dict(db.execute("SELECT hold, state FROM holds WHERE orders = 'o1'").fetchall())
        if len(holds) == 2 and "HELD" not in holds.values():
            break
        assert time.monotonic() < deadline, holds
        time.sleep(0.2)
    assert holds == {first: "RELEASED", f"{first}~1": "CAPTURED"}
    assert db.execute("SELECT * FROM violations").fetchall() == []
    [replayed] = [
        r for r in read_topic(broker.bootstrap, env["AS_OUTPUT"]) if r.json()["order"] == "o1"
    ]
    assert replayed.json()["hold"] == f"{first}~1"
    assert letter.headers["x-source-offset"]
    assert_survivors([worker])
