"""The Apache Kafka launcher (agents_stream.testing.kafka) and what a worker creates on it.

Kafka only: run with ``--broker=kafka`` (or ``both``); skipped on the embedded broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from agents_stream.kafka.admin import TopicAdmin
from agents_stream.testing.kafka import KafkaBroker
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records

pytestmark = [pytest.mark.broker, pytest.mark.kafka_only]


def test_the_broker_is_kafka_and_answers_metadata(broker) -> None:
    assert broker.kind == "kafka"
    assert broker.url == f"kafka://{broker.bootstrap}"
    md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert [b.id for b in md.brokers.values()] == [1]
    assert md.cluster_id
    if isinstance(broker, KafkaBroker):  # not for an external AGENTS_STREAM_TEST_BROKER
        assert broker.running and broker.pid is not None
        assert Path(f"/proc/{broker.pid}").exists() or not Path("/proc").exists()
        assert broker.log_file is not None and "Kafka Server started" in broker.log_file.read_text()


def test_produce_and_consume_round_trip(broker, topic_factory) -> None:
    topic = topic_factory("rt")
    create_topics(broker.bootstrap, [topic], partitions=3)
    sent = [(f"k{i % 7}", {"n": i}) for i in range(200)]
    produce(broker.bootstrap, topic, sent)
    records = read_topic(broker.bootstrap, topic)
    assert sorted(r.json()["n"] for r in records) == list(range(200))
    by_key: dict[str, list[int]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert r.key is not None
        by_key.setdefault(r.key, []).append(r.json()["n"])
    # One key, one partition, in produce order: what the worker's ordering relies on.
    assert by_key == {f"k{k}": list(range(k, 200, 7)) for k in range(7)}


def test_restart_and_crash_on_the_same_log_dir_keep_the_records(broker, tmp_path) -> None:
    """Its own broker, so the session's is not disturbed (``broker`` only selects Kafka)."""
    kafka = KafkaBroker(data_dir=tmp_path / "kafka", log_file=tmp_path / "kafka.log")
    with kafka:
        first_start = kafka.start_seconds
        port, log_dir = kafka.port, kafka.log_dir
        create_topics(kafka.bootstrap, ["kept"], partitions=2)
        produce(kafka.bootstrap, "kept", [(f"k{i}", {"n": i}) for i in range(50)])

        kafka.restart()  # SIGTERM: a controlled shutdown
        assert (kafka.port, kafka.log_dir) == (port, log_dir)
        assert sorted(r.json()["n"] for r in read_topic(kafka.bootstrap, "kept")) == list(range(50))
        produce(kafka.bootstrap, "kept", [("k", {"n": 50})])

        kafka.restart(crash=True)  # SIGKILL: log recovery on start
        assert sorted(r.json()["n"] for r in read_topic(kafka.bootstrap, "kept")) == list(range(51))
        print(f"kafka start {first_start:.1f}s, restart after a crash {kafka.start_seconds:.1f}s")
    assert kafka.pid is None
    assert (log_dir / "meta.properties").exists()  # a data dir it was given is kept


def test_the_worker_creates_a_compacted_co_partitioned_action_state_topic(
    broker, topic_factory, worker_factory
) -> None:
    app_id = topic_factory("app")
    env = {"AS_APP_ID": app_id, "AS_INPUT": topic_factory("in"), "AS_OUTPUT": topic_factory("out")}
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=3)
    worker = worker_factory("tests.apps.ordering:app", env)
    produce(broker.bootstrap, env["AS_INPUT"], [(f"u{i}", {"n": 0}) for i in range(6)])
    # An output per input: the worker set its topics up and ran on them.
    assert len(wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 6, timeout=90)) == 6, (
        worker.log()
    )

    admin = TopicAdmin(broker.bootstrap)
    state = f"{app_id}-action-state"
    dlq = f"{env['AS_INPUT']}-dlq"
    counts = admin.partition_counts([state, dlq, env["AS_OUTPUT"]])
    assert counts == {state: 3, dlq: 3, env["AS_OUTPUT"]: 4}  # co-partitioned; App default
    config = admin.topic_config(state)
    assert config["cleanup.policy"] == "compact"
    assert config["min.compaction.lag.ms"] == "60000"
    assert config["segment.ms"] == "3600000"
    assert admin.topic_config(env["AS_OUTPUT"])["cleanup.policy"] == "delete"
    assert worker.terminate() == 0


def test_startup_time_is_bounded(broker) -> None:
    """Reports what a start costs (the session's broker was started for this run)."""
    if not isinstance(broker, KafkaBroker) or broker.start_seconds is None:
        pytest.skip("an external cluster: not started here")
    print(f"session kafka started in {broker.start_seconds:.1f}s")
    assert broker.start_seconds < 60
