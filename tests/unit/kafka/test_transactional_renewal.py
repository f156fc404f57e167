"""A renewal whose initialisation timed out is resumed on the same producer, not replaced
again (kafka/transactions.py ``_recover``): librdkafka goes on initialising the first one
in the background, and a second replacement was fenced when that completed (the cluster
fault test, below min ISR). Real librdkafka producers, against an address nothing
listens on, so every initialisation times out (retriable)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from agents_stream.errors import KafkaIOError
from agents_stream.host.policy import undelivered
from agents_stream.kafka.transactions import TransactionalProducer, TransactionFailed
from agents_stream.testing import free_port


def test_a_timed_out_renewal_is_resumed_not_replaced():
    producer = TransactionalProducer(
        {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",  # nothing listens there
            "transactional.id": "renewal-test",
            "log_level": 0,
        },
        timeout=0.5,
    )
    try:
        with pytest.raises(TransactionFailed) as renewal:
            producer._renew(TransactionFailed("fenced in a test", fenced=True))
        assert not renewal.value.fenced  # timed out: retriable
        first = producer._producer
        assert producer.renewals == 1
        for _ in range(2):  # the host's recovery, retried with its backoff
            with pytest.raises(TransactionFailed):
                producer.abort()
            assert producer._producer is first, "replaced while its init still runs"
        assert producer.renewals == 1
    finally:
        producer.close(0.1)


def test_a_send_with_no_transaction_open_is_undelivered_not_an_action_error():
    """Between a failed commit and the host's recovery (here: a renewal whose init timed
    out) no transaction is open. librdkafka refused such a produce with _STATE, raised as
    a plain KafkaException: the broker-restart fault test saw seven records dead-lettered
    for it. The producer refuses the send itself, as undelivered (the record is abandoned
    with its partition and run again by the next owner)."""
    producer = TransactionalProducer(
        {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "transactional.id": "no-transaction-test",
            "log_level": 0,
        },
        timeout=0.5,
    )
    try:
        with pytest.raises(TransactionFailed):
            producer._renew(TransactionFailed("fenced in a test", fenced=True))
        producer._open = True  # as after a first begin()
        with pytest.raises(TransactionFailed):
            producer.abort()  # the resumed init times out again: still nothing open
        with pytest.raises(KafkaIOError) as refused:
            producer.send("out", b"v", key=b"k", partition=0)
        assert refused.value.code == KafkaError._STATE
        assert undelivered(refused.value)
        assert producer.sent == 0
    finally:
        producer.close(0.1)
