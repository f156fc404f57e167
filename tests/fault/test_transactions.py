"""Exactly-once: a worker SIGKILLed at each step of a transaction commit.

The worker kills itself (``AGENTS_STREAM_TEST_KILL_IN_TRANSACTION``) at the first commit
that carries offsets: before the offsets are added to the transaction, after they are
added (before the commit), or right after the commit returned (before the caches are
marked committed and queued sends produced). A second worker (a new transactional.id:
the dead one's transaction holds the partitions' last stable offset until the broker
aborts it) finishes the run. A read_committed reader must see each input's output
exactly once; a read_uncommitted reader shows what the aborted transaction had written;
no acknowledged call runs twice. Apache Kafka only: the embedded broker's read_committed
shows aborted records.
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from agents_stream.testing import free_port
from agents_stream.testing.topics import create_topics, produce, read_topic
from tests.apps.effects import REEXECUTED_AFTER_ACK, connect
from tests.fault.fleet import assert_survivors

pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.kafka_only]

INPUTS = 200
PARTITIONS = 4
KILL_ENV = "AGENTS_STREAM_TEST_KILL_IN_TRANSACTION"


def read_uncommitted(bootstrap: str, topic: str) -> int:
    """How many records the topic's log holds, aborted ones included."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "uncommitted",
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen, ends, deadline = 0, set(), time.monotonic() + 20
    while len(ends) < PARTITIONS and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.2):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ends.add(msg.partition())
                continue
            seen += 1
    consumer.close()
    return seen


@pytest.mark.timeout(300)
@pytest.mark.parametrize("step", ["before-offsets", "before-commit", "after-commit"])
def test_kill_at_each_step_of_the_commit(
    step, broker, topic_factory, worker_factory, tmp_path, capsys
):
    db_path = tmp_path / "effects.sqlite"
    connect(str(db_path)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db_path),
        "AS_COMMIT_INTERVAL": "0.5",
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=PARTITIONS)
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [(f"key-{n % 8}", {"scenario": "calls", "n": n, "delay": 0.01}) for n in range(INPUTS)],
    )
    mode = ["--processing-guarantee", "exactly-once"]
    first = worker_factory("tests.apps.crashy:app", {**env, KILL_ENV: step}, extra_args=mode)
    deadline = time.monotonic() + 120
    while first.alive:
        assert time.monotonic() < deadline, first.log()[-3000:]
        time.sleep(0.1)
    assert f"killed in the transaction ({step})" in first.log(), first.log()[-3000:]
    visible = len(read_topic(broker.bootstrap, env["AS_OUTPUT"], timeout=20))
    written = read_uncommitted(broker.bootstrap, env["AS_OUTPUT"])

    port = free_port()
    second = worker_factory(
        "tests.apps.crashy:app", env, extra_args=[*mode, "--metrics-port", str(port)]
    )
    deadline = time.monotonic() + 180
    outputs = []
    while time.monotonic() < deadline:
        outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
        if len({r.json()["n"] for r in outputs}) >= INPUTS:
            break
        time.sleep(0.5)
    time.sleep(2.0)  # a late duplicate would show up here
    outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    assert_survivors([second])  # not killed: running, no CRITICAL line
    second.terminate()
    committed = [
        line
        for line in metrics.splitlines()
        if line.startswith('agents_stream_transactions_total{outcome="committed"}')
    ]
    assert committed and float(committed[0].split()[-1]) > 0, metrics[-2000:]

    per_input = Counter(r.json()["n"] for r in outputs)
    lost = INPUTS - len(per_input)
    duplicates = sum(c - 1 for c in per_input.values())
    db = connect(str(db_path))
    (reexecuted_acked,) = db.execute(REEXECUTED_AFTER_ACK).fetchone()
    (executions,) = db.execute("SELECT COUNT(*) FROM effects").fetchone()
    with capsys.disabled():
        print(
            f"\nkilled {step}: outputs visible read_committed after the kill {visible}, in "
            f"the log {written}; after the restart: lost={lost}, duplicates read_committed="
            f"{duplicates}, acked calls re-executed={reexecuted_acked}, executions="
            f"{executions} for {INPUTS * 3} calls"
        )
    assert lost == 0, second.log()[-3000:]
    assert duplicates == 0, second.log()[-3000:]
    assert reexecuted_acked == 0
    if step == "after-commit":
        assert visible > 0  # the commit landed: its outputs are there, and not again
    else:
        assert written > visible  # the killed transaction's records: written, never seen
