"""Guarantee 8: every host agrees on what is done, and "done" outlives pruning.

A worker processes and commits inputs, and prunes their journal. The group's offsets
are then reset to the beginning while it is stopped: the restarted worker re-consumes
every input, and must neither execute nor output any of them again (side effects
counted in SQLite), because the InputProgress marker written with each commit says
they are done.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps.effects import connect
from tests.fault.scenario import wait_log

pytestmark = pytest.mark.broker

N = 12


def effects(db) -> int:
    with connect(str(db)) as conn:
        return conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0]


def live_kinds(bootstrap: str, topic: str) -> set[bytes]:
    last: dict[bytes, bytes | None] = {}
    for r in sorted(read_topic(bootstrap, topic), key=lambda r: (r.partition, r.offset)):
        last[r.key.encode()] = r.value
    return {k.split(b"\x1f")[0] for k, v in last.items() if v is not None}


def reset_group(bootstrap: str, group: str, topic: str, partitions: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, 0) for p in range(partitions)], asynchronous=False
        )
    finally:
        consumer.close()


def test_reset_offsets_do_not_rerun_completed_inputs(
    broker, topic_factory, worker_factory, tmp_path
):
    db = tmp_path / "effects.sqlite"
    connect(str(db)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db),
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [(f"key-{n}", {"scenario": "calls", "n": n}) for n in range(N)],
    )
    worker = worker_factory("tests.apps.crashy:app", env)
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], N)
    state_topic = f"{env['AS_APP_ID']}-action-state"
    deadline = time.monotonic() + 30
    while live_kinds(broker.bootstrap, state_topic) != {b"p"} and time.monotonic() < deadline:
        time.sleep(0.5)  # committed, marked and pruned
    assert live_kinds(broker.bootstrap, state_topic) == {b"p"}
    assert worker.terminate() == 0
    executed = effects(db)
    assert executed == 3 * N

    reset_group(broker.bootstrap, env["AS_APP_ID"], env["AS_INPUT"], 2)
    again = worker_factory("tests.apps.crashy:app", env)
    wait_log(again, "below completed-through marker")
    time.sleep(3)  # time to (wrongly) run and output what it re-consumed
    assert effects(db) == executed, "completed inputs were executed again"
    assert len(read_topic(broker.bootstrap, env["AS_OUTPUT"])) == N, "outputs sent again"
    assert again.terminate() == 0

    # The explicit opt-in runs them again (their journal is pruned: all execute).
    reset_group(broker.bootstrap, env["AS_APP_ID"], env["AS_INPUT"], 2)
    rerun = worker_factory("tests.apps.crashy:app", env, extra_args=["--rerun-completed"])
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 2 * N)
    assert "rerun_completed" in rerun.log()
    assert effects(db) == 2 * executed
    assert rerun.terminate() == 0
