"""A transactional producer fenced by another instance of its transactional.id, on
Apache Kafka: its writes fail as undelivered (KafkaIOError, code _FATAL: not the record's
fault, never a dead letter, host/policy.py), and its abort replaces it with a producer
whose transactions commit again.

Found by the cluster fault test: below min ISR a replacement producer's initialisation
timed out, the worker replaced it again, and the first one's initialisation completed
later and fenced the second: every record's output write then raised librdkafka's
synchronous "Local: Fatal error", which went to the dead-letter topic, and the commit
loop stopped the worker with a CRITICAL line.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from confluent_kafka import KafkaError, Producer

from agents_stream.errors import KafkaIOError
from agents_stream.host.policy import undelivered
from agents_stream.kafka.transactions import (
    ABORTS_BEFORE_RENEWAL,
    TransactionalProducer,
    TransactionFailed,
)
from agents_stream.testing.kafka import KafkaBroker
from agents_stream.testing.topics import create_topics, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.kafka_only]


def test_a_fenced_producer_fails_writes_as_undelivered_and_is_replaced_by_abort(
    broker, topic_factory
):
    topic = topic_factory("fenced")
    create_topics(broker.bootstrap, [topic], partitions=2)
    txn_id = f"{topic}-w1"
    producer = TransactionalProducer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id, "log_level": 0},
        timeout=10.0,
    )
    try:
        producer.begin()
        producer.send(topic, b"before", partition=0).result(10)
        producer.commit([], None)

        # Another instance of the transactional.id: its initialisation fences ours.
        other = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
        other.init_transactions(30)

        # Ours learns it at its next request; from then on every write raises at once.
        failure: BaseException | None = None
        deadline = time.monotonic() + 30
        while failure is None and time.monotonic() < deadline:
            try:
                producer.send(topic, b"fenced", partition=1).result(10)
            except Exception as exc:
                failure = exc
        assert failure is not None
        refused: BaseException | None = None
        try:
            producer.send(topic, b"after the fence", partition=1)
        except KafkaIOError as exc:
            refused = exc
        assert isinstance(refused, KafkaIOError), refused
        assert refused.code == KafkaError._FATAL
        assert undelivered(refused)

        # The recovery: abort replaces the fenced producer (its init fences `other`).
        producer.abort()
        assert producer.renewals == 1
        producer.send(topic, b"after the renewal", partition=0).result(10)
        producer.commit([], None)
        del other
    finally:
        producer.close(5)
    values = sorted(r.value for r in read_topic(broker.bootstrap, topic))
    # read_committed: the fenced transaction's record is not there.
    assert values == [b"after the renewal", b"before"]


def test_an_abort_that_keeps_timing_out_replaces_the_producer(tmp_path, topic_factory):
    """On the three-node test cluster an abort timed out every 10 s for minutes (the
    coordinator's answer never came) and the worker processed nothing. After
    ABORTS_BEFORE_RENEWAL timeouts in a row the producer is replaced: the new one's
    initialisation settles the transaction at the coordinator. Here the broker is frozen
    (SIGSTOP) under an open transaction; once it is back the recovery completes, the
    next transaction commits and read_committed sees only it."""
    kafka = KafkaBroker(data_dir=tmp_path / "kafka", log_file=tmp_path / "kafka.log")
    topic = topic_factory("abort-timeouts")
    with kafka:
        create_topics(kafka.bootstrap, [topic], partitions=1)
        producer = TransactionalProducer(
            {"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{topic}-w1"},
            timeout=2.0,
        )
        try:
            producer.begin()
            producer.send(topic, b"aborted", partition=0).result(10)
            assert kafka.pid is not None
            os.kill(kafka.pid, signal.SIGSTOP)
            try:
                for _ in range(ABORTS_BEFORE_RENEWAL):
                    with pytest.raises(TransactionFailed):
                        producer.abort()
                assert producer.renewals == 1
            finally:
                os.kill(kafka.pid, signal.SIGCONT)
            deadline = time.monotonic() + 60
            while True:  # the host's recovery, retried with its backoff
                try:
                    producer.abort()
                    break
                except TransactionFailed:
                    assert time.monotonic() < deadline
                    time.sleep(0.5)
            assert producer.renewals == 1  # its initialisation was resumed, not replaced
            producer.send(topic, b"committed", partition=0).result(10)
            producer.commit([], None)
        finally:
            producer.close(5)
        assert [r.value for r in read_topic(kafka.bootstrap, topic)] == [b"committed"]
