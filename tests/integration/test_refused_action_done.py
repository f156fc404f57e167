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


BROKER_APP = "tests.apps.oversize_broker_app:app"


@pytest.mark.kafka_only
@pytest.mark.parametrize("limited", ["output", "action-state"])
def test_the_broker_refuses_a_record_over_the_topics_max_message_bytes(
    limited, broker, topic_factory, worker_factory
):
    """Apache Kafka's own refusal (the embedded broker enforces no max.message.bytes):
    the producer allows 1 MB, the output topic or the ActionState topic only 20,000 bytes.
    A 40,000-byte output, or the ActionDone that holds it, is refused by the broker; only
    its record is dead-lettered, the others' outputs are emitted once, the worker goes on.
    Kafka's limit bounds a record batch, not a record: the records that shared the
    refused batch must be sent again, each in a batch of its own.
    """
    from agents_stream.kafka.admin import TopicAdmin, TopicSpec, compacted

    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
    }
    small = {"max.message.bytes": "20000"}
    state = compacted(f"{env['AS_APP_ID']}-action-state", 2)
    TopicAdmin(broker.bootstrap).ensure(
        [
            TopicSpec(env["AS_INPUT"], 2),
            TopicSpec(env["AS_OUTPUT"], 2, small if limited == "output" else {}),
            TopicSpec(state.name, 2, {**state.config, **(small if limited != "output" else {})}),
        ]
    )
    worker = worker_factory(BROKER_APP, env)
    produce(
        broker.bootstrap, env["AS_INPUT"], [(f"k{i}", {"id": i, "big": i == 5}) for i in range(12)]
    )
    [letter] = wait_for_records(broker.bootstrap, f"{env['AS_INPUT']}-dlq", 1, timeout=90)
    assert letter.headers["x-error-type"].endswith(b"RecordRefusedError"), letter.headers
    assert b"too large" in letter.headers["x-error-message"].lower(), letter.headers
    assert letter.json()["id"] == 5
    produce(broker.bootstrap, env["AS_INPUT"], [(f"k{i}", {"id": i}) for i in range(12, 16)])
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 15, timeout=60)
    assert worker.alive, worker.log()[-3000:]
    assert worker.terminate() == 0, worker.log()[-3000:]
    ids = sorted(r.json()["id"] for r in read_topic(broker.bootstrap, env["AS_OUTPUT"]))
    assert ids == [i for i in range(16) if i != 5], worker.log()[-3000:]  # each once
    print(f"\nbroker refusal ({limited} topic): {letter.headers['x-error-message'][:160]!r}")
