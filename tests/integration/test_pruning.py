"""Completed ActionStates are tombstoned once their input offset is committed, so the
compacted ActionState topic does not grow without bound; memory snapshots stay."""

from __future__ import annotations

import time

import pytest

from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps.effects import connect

pytestmark = pytest.mark.broker


def live_keys(records) -> dict[bytes, bytes | None]:
    last: dict[bytes, bytes | None] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        last[r.key.encode()] = r.value  # compaction keeps the last value per key
    return {k: v for k, v in last.items() if v is not None}


def test_completed_action_states_are_pruned_after_commit(
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
        [(f"key-{n}", {"scenario": "two-actions", "n": n}) for n in range(6)],
    )
    worker = worker_factory("tests.apps.crashy:app", env)
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 6)
    state_topic = f"{env['AS_APP_ID']}-action-state"
    deadline = time.monotonic() + 30
    while True:
        records = read_topic(broker.bootstrap, state_topic)
        # Completed-through markers (kind "p") stay: they say those inputs are done.
        live = {k: v for k, v in live_keys(records).items() if not k.startswith(b"p\x1f")}
        kinds = {k.split(b"\x1f")[0] for k in live}
        if kinds <= {b"m"} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert kinds == {b"m"}, sorted(live)  # only the 6 keys' memory snapshots remain
    assert len(live) == 6
    tombstones = sum(r.value is None for r in records)
    assert tombstones >= 6 * (2 + 2)  # per input: 2 calls + 2 ActionDone, at least
    worker.terminate()
