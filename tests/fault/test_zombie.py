"""Zombie: a worker frozen past its session timeout (SIGSTOP), then resumed (SIGCONT).

Two workers share 4 partitions; 400 inputs x 2 journaled calls of 50 ms, each call's
start and acknowledged result written to an external ledger (SQLite) with the process id
and wall time. Once the victim is mid-work it is SIGSTOPped for 20 s (the session timeout
is 6 s): the other worker takes its partitions over and runs their uncommitted records.
On SIGCONT the victim must notice its own freeze before anything else (durable/
ownership.py): no code block it starts after the resume duplicates one the other worker
ran, no acknowledged call runs twice, no input is lost, and duplicate outputs are bounded
by the records the victim had in flight at the SIGSTOP. The figures are printed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import threading
import time
from collections import Counter
from datetime import datetime

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from agents_stream.testing.topics import Inputs, create_topics
from tests.apps.zombie_app import count
from tests.fault.fleet import assert_survivors, lost_report
from tests.fault.scenario import wait_log

pytestmark = [pytest.mark.broker, pytest.mark.fault]

PARTITIONS = 4
INPUTS = 400
KEYS_PER_PARTITION = 5
# 20 s: the session (6 s) expires, the other worker takes over. 4.3 s: over the freeze
# limit (3.75 s: session - 1.5 heartbeat intervals) but the session most likely survives:
# the victim fences everything, then the group confirms and it takes its partitions back.
FROZEN = [20.0, 4.3]


class Tail(threading.Thread):
    """Every output as it arrives: (n, pid of the worker that made it, arrival time)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.outs: list[tuple[int, int, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "zombie-tail"})
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        while not self.stop.is_set():
            for msg in consumer.consume(500, 0.1):
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    continue
                v = json.loads(msg.value())
                self.outs.append((v["n"], v["pid"], time.time()))
        consumer.close()


_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def regained_at(log: str, after: float) -> float:
    """Wall time of the victim's first log line after ``after`` saying it holds partitions
    again (a new assignment, or the group confirming the old one); inf if none. The hold
    is taken before the line is written and records are processed only after it."""
    for line in log.splitlines():
        m = _STAMP.match(line)
        if m is None or not ("group confirmed" in line or owns_some(line)):
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at > after:
            return at
    return float("inf")


def owns_some(log: str) -> bool:
    return any("assigned " in line and "assigned nothing" not in line for line in log.splitlines())


@pytest.mark.kafka_proof
@pytest.mark.parametrize("frozen_s", FROZEN)
def test_frozen_worker_touches_nothing_after_resume(
    frozen_s, broker, topic_factory, worker_factory, tmp_path, capsys
):
    _zombie(frozen_s, "at-least-once", broker, topic_factory, worker_factory, tmp_path, capsys)


@pytest.mark.kafka_only
def test_frozen_worker_exactly_once_no_duplicate_downstream(
    broker, topic_factory, worker_factory, tmp_path, capsys
):
    """Exactly-once: the zombie's open transaction aborts (or times out) and the other
    worker's commits hold each output once; the tail reads read_committed (librdkafka's
    default), so duplicates downstream must be 0, not merely bounded."""
    _zombie(20.0, "exactly-once", broker, topic_factory, worker_factory, tmp_path, capsys)


def _zombie(frozen_s, guarantee, broker, topic_factory, worker_factory, tmp_path, capsys) -> None:
    mode = ["--processing-guarantee", guarantee]
    ledger = tmp_path / "ledger.sqlite"
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_LEDGER": str(ledger),
        "AS_COMMIT_INTERVAL": "0.3",
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=PARTITIONS)
    app = "tests.apps.zombie_app:app"
    victim = worker_factory(app, env, extra_args=[*mode, "--data-dir", str(tmp_path / "d0")])
    wait_log(victim, "assigned", timeout=90)
    other = worker_factory(app, env, extra_args=[*mode, "--data-dir", str(tmp_path / "d1")])
    deadline = time.monotonic() + 90
    while not (owns_some(other.log()) and "revoked" in victim.log()):
        assert time.monotonic() < deadline, victim.log()[-3000:] + other.log()[-3000:]
        time.sleep(0.2)
    assert victim.proc is not None and other.proc is not None
    vpid, opid = victim.proc.pid, other.proc.pid

    tail = Tail(broker.bootstrap, env["AS_OUTPUT"])
    tail.start()
    inputs = Inputs(broker.bootstrap)
    for n in range(INPUTS):
        p = n % PARTITIONS
        key = f"p{p}-k{(n // PARTITIONS) % KEYS_PER_PARTITION}"
        inputs.send(env["AS_INPUT"], json.dumps({"n": n}).encode(), key, partition=p)
    inputs.close(60)

    db = sqlite3.connect(str(ledger), timeout=60)
    db.execute("PRAGMA busy_timeout=60000")

    deadline = time.monotonic() + 90
    while count(db, "start", vpid) < 30:
        assert time.monotonic() < deadline, victim.log()[-3000:]
        time.sleep(0.02)
    os.kill(vpid, signal.SIGSTOP)
    stopped_at = time.time()
    time.sleep(frozen_s)
    resumed_at = time.time()
    os.kill(vpid, signal.SIGCONT)

    deadline = time.monotonic() + 120
    while len({n for n, _, _ in tail.outs}) < INPUTS and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3.0)  # late zombie work would show up here
    tail.stop.set()
    tail.join(30)
    victim_log, other_log = victim.log(), other.log()
    assert victim.alive and other.alive, victim_log[-3000:] + other_log[-3000:]
    # Frozen, not killed: both must be running and have logged no CRITICAL line.
    assert_survivors([victim, other])
    victim.terminate()
    other.terminate()

    rows = db.execute("SELECT id, what, pid, n, i, t FROM calls ORDER BY id").fetchall()
    db.close()
    starts = [(id_, pid, n, i, t) for id_, what, pid, n, i, t in rows if what == "start"]
    acked_at = {(n, i): id_ for id_, what, _, n, i, _ in reversed(rows) if what == "acked"}
    run_count = Counter((n, i) for _, _, n, i, _ in starts)
    by_other = {(n, i) for _, pid, n, i, _ in starts if pid == opid}
    victim_after = [(n, i, t) for _, pid, n, i, t in starts if pid == vpid and t > resumed_at]
    # A zombie start is one made after the resume and before the group gave the victim
    # partitions again: from then on it owns them, and re-running a call the other worker
    # started but abandoned on its revoke (never acknowledged) is the crash window that
    # DESIGN.md allows, not a zombie (counted by reexecuted_acked when it was acknowledged).
    regained = regained_at(victim_log, resumed_at)
    zombie_dups = [(n, i) for n, i, t in victim_after if (n, i) in by_other and t < regained]
    reexecuted_acked = [
        (n, i) for id_, _, n, i, _ in starts if (n, i) in acked_at and id_ > acked_at[(n, i)]
    ]
    # Arrived before the resume: made before the SIGSTOP (a frozen process makes none).
    victim_outputs = {n for n, pid, t in tail.outs if pid == vpid and t < resumed_at}
    started_before = {n for _, pid, n, _, t in starts if pid == vpid and t < stopped_at}
    in_flight_at_stop = len(started_before - victim_outputs)
    outputs = Counter(n for n, _, _ in tail.outs)
    duplicates = sum(c - 1 for c in outputs.values())
    lost = sorted(set(range(INPUTS)) - set(outputs))
    twice = sum(1 for c in run_count.values() if c > 1)

    path = (
        "session expired"
        if "without a revoke" in victim_log
        else "group confirmed the partitions"
        if "group confirmed" in victim_log
        else "neither"
    )
    with capsys.disabled():
        print(
            f"\nzombie ({getattr(broker, 'kind', 'broker')}, {guarantee}): frozen {frozen_s:.1f}s ({path}); "
            f"victim "
            f"had {in_flight_at_stop} records in flight at the SIGSTOP; after SIGCONT it "
            f"started {len(victim_after)} code blocks ({len(zombie_dups)} of calls the "
            f"other worker ran); calls run twice in all: {twice} (acknowledged ones: "
            f"{len(reexecuted_acked)}); duplicate outputs: {duplicates}; lost inputs: "
            f"{len(lost)}"
        )
    assert "treated as lost" in victim_log or "without a revoke" in victim_log, victim_log[-4000:]
    assert not lost, lost_report(lost, env["AS_INPUT"], [victim, other], partitions=PARTITIONS)
    assert not zombie_dups, (zombie_dups[:20], victim_log[-4000:])
    assert not reexecuted_acked, reexecuted_acked[:20]
    assert duplicates <= in_flight_at_stop, (duplicates, in_flight_at_stop)
    if guarantee == "exactly-once":
        assert duplicates == 0, (duplicates, victim_log[-4000:])
