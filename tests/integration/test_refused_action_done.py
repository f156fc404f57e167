"""An ActionDone the producer refuses (its outputs fit one by one, not together): only
that record is dead-lettered, the records finished with it in one group commit are
emitted, and the worker goes on."""

from __future__ import annotations

import pytest

from agents_stream.serde.values import value_codec
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps.oversize_output_app import OUTPUT_SCHEMA

pytestmark = pytest.mark.broker

APP = "tests.apps.oversize_app:app"


def started(broker, topic_factory, worker_factory, app):  # type: ignore[no-untyped-def]
    """A worker of ``app`` on fresh topics; (worker, input topic, output topic)."""
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    return worker_factory(app, env), env["AS_INPUT"], env["AS_OUTPUT"]


def test_only_the_record_whose_action_done_is_refused_is_dead_lettered(
    broker, topic_factory, worker_factory
):
    worker, source, out = started(broker, topic_factory, worker_factory, APP)
    # Distinct keys, produced together: they start (and finish) in the same batches.
    first = [(f"k{i}", {"id": i, "big": i == 5}) for i in range(12)]
    produce(broker.bootstrap, source, first)
    outputs = wait_for_records(broker.bootstrap, out, 22, timeout=60)
    assert sorted({r.json()["id"] for r in outputs}) == [i for i in range(12) if i != 5]
    [letter] = wait_for_records(broker.bootstrap, f"{source}-dlq", 1, timeout=30)
    assert letter.headers["x-error-type"].endswith(b"RecordRefusedError"), letter.headers
    assert b"message.max.bytes" in letter.headers["x-error-message"]
    assert letter.json()["id"] == 5
    # Still running, and its partitions still commit and process.
    produce(broker.bootstrap, source, [(f"k{i}", {"id": i}) for i in range(12, 16)])
    outputs = wait_for_records(broker.bootstrap, out, 30, timeout=60)
    assert {r.json()["id"] for r in outputs} >= set(range(12, 16)), worker.log()
    assert worker.terminate() == 0, worker.log()


def test_only_the_record_whose_output_is_refused_is_dead_lettered(
    broker, topic_factory, worker_factory
):
    """One output over message.max.bytes in a group commit's outputs: the others are
    sent (each once) and their records finish; only its record is dead-lettered."""
    app = "tests.apps.oversize_output_app:app"
    worker, source, out = started(broker, topic_factory, worker_factory, app)
    produce(broker.bootstrap, source, [(f"k{i}", {"id": i, "big": i == 5}) for i in range(12)])
    [letter] = wait_for_records(broker.bootstrap, f"{source}-dlq", 1, timeout=60)
    assert letter.headers["x-error-type"].endswith(b"RecordRefusedError"), letter.headers
    assert letter.json()["id"] == 5
    produce(broker.bootstrap, source, [(f"k{i}", {"id": i}) for i in range(12, 16)])
    wait_for_records(broker.bootstrap, out, 15, timeout=60)
    assert worker.terminate() == 0, worker.log()
    codec = value_codec(OUTPUT_SCHEMA)
    ids = sorted(codec.decode(r.value)["id"] for r in read_topic(broker.bootstrap, out))
    assert ids == [i for i in range(16) if i != 5], worker.log()  # each once
