"""A cache whose checkpoint is past the end of its ActionState partition (the topic was
deleted and created again) is wiped and rebuilt from the new topic's records."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde import default_journal_codec
from agents_stream.state import recovery
from agents_stream.state.cache import PartitionCache

pytestmark = pytest.mark.broker


def fill(bootstrap: str, topic: str, prefix: str, count: int) -> None:
    codec = default_journal_codec()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        entry = CallEntry(
            ActionRef(f"{prefix}{i}", 0, "A.process#0"), 0, "f", "d", CallStatus.PENDING
        )
        producer.produce(topic, key=entry_key_bytes(entry), value=codec.encode(entry), partition=0)
    assert producer.flush(30) == 0


def test_checkpoint_past_the_end_rebuilds_from_scratch(broker, topic_factory, tmp_path):
    topic = topic_factory("state")
    codec = default_journal_codec()
    TopicAdmin(broker.bootstrap).ensure([compacted(topic, 1)])
    fill(broker.bootstrap, topic, "old", 50)
    cache = PartitionCache(tmp_path / "p0")
    assert recovery.rebuild_partitions(broker.bootstrap, topic, {0: cache}, codec) == {0: 50}

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:  # deletion is asynchronous on some brokers
        try:
            TopicAdmin(broker.bootstrap).ensure([compacted(topic, 1)])
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    fill(broker.bootstrap, topic, "new", 10)

    assert recovery.rebuild_partitions(broker.bootstrap, topic, {0: cache}, codec) == {0: 10}
    assert cache.checkpoint == 10
    stored = list(cache.db.keys())
    keys = [k for k in stored if not k.startswith(b"\x00")]
    assert len(keys) == 10 and all(b"new" in k for k in keys)
    cache.close()
