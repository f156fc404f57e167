"""A cache rebuild ends at its cancel signal between batches: the batches applied so far
are checkpointed, the store assigns nothing and closes the caches, and the next rebuild
reads only the rest."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from confluent_kafka import Producer

from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.kafka.producer import AckingProducer
from agents_stream.serde import default_journal_codec
from agents_stream.state import recovery
from agents_stream.state.cache import PartitionCache
from agents_stream.state.kafka import KafkaActionStateStore

pytestmark = pytest.mark.broker

RECORDS = 1000


@pytest.fixture
def journal(broker, topic_factory) -> str:
    topic = topic_factory("state")
    TopicAdmin(broker.bootstrap).ensure([compacted(topic, 1)])
    codec = default_journal_codec()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        entry = CallEntry(ActionRef(f"k{i}", 0, "A.process#0"), 0, "f", "d", CallStatus.PENDING)
        producer.produce(topic, key=entry_key_bytes(entry), value=codec.encode(entry), partition=0)
    assert producer.flush(30) == 0
    return topic


class CancelOnceApplied:
    """A cancel event that reads as set once the cache holds some batches: the stop
    lands mid-rebuild, whatever the fetch timing."""

    def __init__(self, cache: PartitionCache) -> None:
        self.cache = cache

    def is_set(self) -> bool:
        return self.cache.checkpoint >= 300


def test_cancelled_rebuild_keeps_the_applied_batches(broker, journal, tmp_path, monkeypatch):
    monkeypatch.setattr(recovery, "BATCH", 100)
    codec = default_journal_codec()
    cache = PartitionCache(tmp_path / "p0")
    cancel = CancelOnceApplied(cache)
    with pytest.raises(recovery.RebuildCancelled, match="cancelled after"):
        recovery.rebuild_partitions(broker.bootstrap, journal, {0: cache}, codec, cancel=cancel)  # type: ignore[arg-type]
    applied = cache.checkpoint
    assert 300 <= applied < RECORDS
    rest = recovery.rebuild_partitions(broker.bootstrap, journal, {0: cache}, codec)
    assert rest == {0: RECORDS - applied}
    assert cache.checkpoint == RECORDS
    cache.close()


def test_store_assign_cancelled_assigns_nothing_and_closes_the_cache(
    broker, journal, tmp_path: Path
):
    cancel = threading.Event()
    cancel.set()
    producer = AckingProducer({"bootstrap.servers": broker.bootstrap})
    store = KafkaActionStateStore(
        topic=journal,
        producer=producer,
        codec=default_journal_codec(),
        data_dir=tmp_path,
        bootstrap=broker.bootstrap,
        cancel=cancel,
    )
    with pytest.raises(recovery.RebuildCancelled):
        store.assign(0)
    assert store.partitions == []
    cancel.clear()
    assert store.assign(0) == RECORDS  # RocksDB's lock was released: the cache reopens
    assert store.partitions == [0]
    store.close()
    producer.close()
