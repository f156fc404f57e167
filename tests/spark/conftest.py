"""Spark fixtures: one local SparkSession per test run and helpers to fill topics."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from agents_stream.testing import EmbeddedBroker

# (partition, key, value, headers, timestamp ms or None)
Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int | None]


_official: tuple[str, list] | str | None = None


def official_connector() -> tuple[str, list] | str:
    """Spark's own Kafka connector for the session (version, jars), or why there is none;
    fetched with mvn on first use (~8 s), then from the cache."""
    global _official
    if _official is None:
        from agents_stream.spark.official_connector import connector_jars

        try:
            _official = connector_jars()
        except (OSError, subprocess.SubprocessError) as exc:
            _official = f"cannot fetch Spark's Kafka connector: {exc}"
    return _official


@pytest.fixture(scope="session")
def spark():
    """A ``local[2]`` session shared by every Spark test (cold start costs ~10-20 s), with
    Spark's own Kafka connector on its classpath when it can be had, so that the
    cross-check (test_official_connector.py) needs no second session."""
    from agents_stream.spark import SparkUnavailableError, get_spark

    official = official_connector()
    jars = [] if isinstance(official, str) else official[1]
    try:
        session = get_spark("agents-stream-tests", master="local[2]", jars=jars)
    except SparkUnavailableError as exc:
        pytest.skip(str(exc))
    yield session
    session.stop()


@pytest.fixture
def kafka_topic(
    broker: EmbeddedBroker, topic_factory: Callable[[str], str]
) -> Callable[[int], str]:
    """Creates a fresh topic with the given partition count and returns its name."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def make(partitions: int = 1) -> str:
        name = topic_factory("spark")
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=30)
        return name

    return make


@pytest.fixture
def produce(broker: EmbeddedBroker) -> Iterator[Callable[[str, Sequence[Record]], None]]:
    """Produces records to explicit partitions; linger makes multi-record batches."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})

    def send(topic: str, records: Sequence[Record]) -> None:
        for partition, key, value, headers, ts in records:
            kwargs = {"timestamp": ts} if ts is not None else {}
            producer.produce(
                topic, value=value, key=key, partition=partition, headers=headers, **kwargs
            )
        assert producer.flush(30) == 0

    yield send
    producer.flush(5)
