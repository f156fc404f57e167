"""Which failures escaping an action run are a write the cluster did not take (never a
dead letter: the worker takes its partitions again, host/policy.py ``undelivered``)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from agents_stream.errors import KafkaIOError, RecordRefusedError
from agents_stream.host.policy import Verdict, classify, undelivered


@pytest.mark.parametrize(
    "code",
    [KafkaError._MSG_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError._FENCED,
     KafkaError._TRANSPORT, KafkaError.REQUEST_TIMED_OUT,
     # A producer fenced by a newer instance of its transactional.id refuses every
     # write at once (kafka/producer.py): replaced by the host, not the record's fault.
     KafkaError._FATAL],
)  # fmt: skip
def test_a_write_the_cluster_did_not_take_is_undelivered(code):
    exc = KafkaIOError(f"delivery to orders-out failed: {KafkaError(code)}", code=code)
    assert undelivered(exc)


def test_the_records_own_faults_and_refusals_are_not():
    too_large = RecordRefusedError(
        "delivery to out failed: message too large", code=KafkaError.MSG_SIZE_TOO_LARGE
    )
    assert not undelivered(too_large)
    assert classify(too_large, "dlq") is Verdict.DEAD_LETTER  # the record's own fault
    denied = KafkaIOError(
        "delivery to out failed: Broker: Topic authorization failed",
        code=KafkaError.TOPIC_AUTHORIZATION_FAILED,
    )
    assert not undelivered(denied)
    assert classify(denied, "dlq") is Verdict.FATAL
    assert not undelivered(RuntimeError("shipping address missing"))
    assert not undelivered(KafkaIOError("delivery to out failed", code=None))
