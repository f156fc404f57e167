"""Keyless records and tombstones against the real broker (worker subprocess)."""

from __future__ import annotations

import json
import time

import pytest

from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records

pytestmark = pytest.mark.broker

APP = "tests.apps.keyless_app:app"


def env_for(topic_factory, tombstones: str = "skip") -> dict[str, str]:
    return {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_TOMBSTONES": tombstones,
    }


def test_keyless_records_run_independently_and_memory_use_is_a_clear_dlq(
    broker, topic_factory, worker_factory
):
    env = env_for(topic_factory)
    inp = env["AS_INPUT"]
    create_topics(broker.bootstrap, [inp], partitions=1)
    # One partition, no keys: were they one key, they would run one after another (8 s).
    produce(broker.bootstrap, inp, [(None, {"n": n, "sleep": 2.0}) for n in range(4)])
    produce(broker.bootstrap, inp, [(None, {"n": 9, "memory": True})])
    worker = worker_factory(APP, env)
    outputs = [
        r.json() for r in wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 4, timeout=90)
    ]
    assert sorted(o["n"] for o in outputs) == [0, 1, 2, 3], worker.log()
    assert {o["key"] for o in outputs} == {""}
    # all four overlapped in time: none waited for another
    assert max(o["start"] for o in outputs) < min(o["end"] for o in outputs), outputs
    dlq = wait_for_records(broker.bootstrap, f"{inp}-dlq", 1, timeout=30)
    assert dlq[0].headers["x-error-stage"] == b"action"
    message = dlq[0].headers["x-error-message"].decode()
    assert f"record {inp}[0]@4 has no key" in message, message
    assert "short-term memory is per key" in message
    assert worker.alive


def test_tombstones_are_skipped_by_default_and_committed(broker, topic_factory, worker_factory):
    env = env_for(topic_factory)
    inp = env["AS_INPUT"]
    create_topics(broker.bootstrap, [inp], partitions=1)
    produce(broker.bootstrap, inp, [("a", None), ("b", None)], raw=True)
    produce(broker.bootstrap, inp, [("a", {"n": 1})])
    worker = worker_factory(APP, env)
    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 1, timeout=90)
    assert [r.json()["n"] for r in outputs] == [1]
    time.sleep(1.5)  # a commit interval
    assert worker.terminate() == 0
    log = worker.log()
    assert "tombstones_skipped=2" in log, log
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
    # committed: a restarted worker neither re-runs nor dead-letters them
    again = worker_factory(APP, env)
    time.sleep(6)
    assert len(read_topic(broker.bootstrap, env["AS_OUTPUT"])) == 1, again.log()
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []


def test_tombstones_are_delivered_with_the_opt_in(broker, topic_factory, worker_factory):
    env = env_for(topic_factory, tombstones="deliver")
    inp = env["AS_INPUT"]
    create_topics(broker.bootstrap, [inp], partitions=1)
    produce(broker.bootstrap, inp, [("a", None)], raw=True)
    worker = worker_factory(APP, env)
    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 1, timeout=90)
    assert json.loads(outputs[0].value) == {"key": "a", "tombstone": True}, worker.log()
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
