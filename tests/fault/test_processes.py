"""``worker --processes 2``: two worker processes under one command share the partitions;
one SIGKILLed is restarted by the supervisor; SIGTERM stops both. Real broker, real
subprocesses, side effects counted in SQLite (``tests/apps/effects.py``)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from agents_stream.testing.topics import Inputs, create_topics
from tests.apps.effects import REEXECUTED_AFTER_ACK, connect

pytestmark = [pytest.mark.broker, pytest.mark.fault]

PARTITIONS = 4


def children(pid: int) -> set[int]:
    """Live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def produce(bootstrap: str, topic: str, numbers: range) -> None:
    inputs = Inputs(bootstrap)
    for n in numbers:
        p = n % PARTITIONS
        inputs.send(topic, json.dumps({"n": n}).encode(), f"p{p}-k{n % 7}", partition=p)
    inputs.close(60)


class Outputs:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "log_level": 3}
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.seen: list[dict] = []

    def until(self, count: int, supervisor, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while len({o["n"] for o in self.seen}) < count:
            assert time.monotonic() < deadline, (
                f"{len({o['n'] for o in self.seen})} of {count} outputs after {timeout:.0f}s, "
                f"missing {sorted(set(range(count)) - {o['n'] for o in self.seen})[:20]}\n"
                + supervisor.log()[-4000:]
            )
            assert supervisor.alive, supervisor.log()[-4000:]
            for msg in self.consumer.consume(500, 0.2):
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    continue
                self.seen.append(json.loads(msg.value()))


def test_two_processes_share_restart_and_stop(broker, topic_factory, worker_factory, tmp_path):
    db_path = tmp_path / "effects.sqlite"
    connect(str(db_path)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db_path),
        "AS_COMMIT_INTERVAL": "0.3",
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=PARTITIONS)
    supervisor = worker_factory("tests.apps.failover_app:app", env, extra_args=["--processes", "2"])
    assert supervisor.proc is not None
    outputs = Outputs(broker.bootstrap, env["AS_OUTPUT"])

    # Both children join one group and split the partitions.
    deadline = time.monotonic() + 90
    while len(children(supervisor.proc.pid)) < 2:
        assert time.monotonic() < deadline and supervisor.alive, supervisor.log()[-4000:]
        time.sleep(0.2)
    first = children(supervisor.proc.pid)
    # Settled once both have partitions (the second one's come from the first).
    while not all(
        f" process-{i} INFO agents_stream.worker: assigned " in supervisor.log() for i in (0, 1)
    ):
        assert time.monotonic() < deadline and supervisor.alive, supervisor.log()[-4000:]
        time.sleep(0.2)
    produce(broker.bootstrap, env["AS_INPUT"], range(200))
    outputs.until(200, supervisor)
    assert {o["pid"] for o in outputs.seen} == first, supervisor.log()[-4000:]
    data = Path(tmp_path / "data")
    assert sorted(p.name for p in data.iterdir()) == ["process-0", "process-1"]
    log = supervisor.log()
    assert " process-0 INFO " in log and " process-1 INFO " in log, log[-4000:]

    # A crash of one child: the supervisor starts another; nothing is lost.
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len(children(supervisor.proc.pid) - first) < 1:
        assert time.monotonic() < deadline and supervisor.alive, supervisor.log()[-4000:]
        time.sleep(0.2)
    assert f"(pid {victim}) exited with signal 9" in supervisor.log()
    # The new child exists a moment before the supervisor logs that it started it.
    while "restarted: pid" not in supervisor.log():
        assert time.monotonic() < deadline and supervisor.alive, supervisor.log()[-4000:]
        time.sleep(0.2)
    produce(broker.bootstrap, env["AS_INPUT"], range(200, 400))
    outputs.until(400, supervisor)

    # SIGTERM: every child stops gracefully, and the command exits 0.
    now = children(supervisor.proc.pid)
    assert len(now) == 2
    assert supervisor.terminate(60) == 0, supervisor.log()[-4000:]
    assert not any(alive(pid) for pid in now)

    per_input = Counter(o["n"] for o in outputs.seen)
    assert set(per_input) == set(range(400))
    db = connect(str(db_path))
    (reexecuted_acked,) = db.execute(REEXECUTED_AFTER_ACK).fetchone()
    db.close()
    assert reexecuted_acked == 0
