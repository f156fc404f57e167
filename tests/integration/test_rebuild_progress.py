"""A real cache rebuild reports progress (records done / total from the fetched high
watermarks) as log lines when stderr is not a terminal."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from confluent_kafka import Producer

from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde import default_journal_codec
from agents_stream.state import recovery
from agents_stream.state.cache import PartitionCache

pytestmark = pytest.mark.broker


def test_rebuild_logs_progress_lines(broker, topic_factory, tmp_path, monkeypatch, caplog):
    topic = topic_factory("state")
    TopicAdmin(broker.bootstrap).ensure([compacted(topic, 2)])
    codec = default_journal_codec()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(1500):
        entry = CallEntry(ActionRef(f"k{i}", 0, "A.process#0"), 0, "f", "d", CallStatus.PENDING)
        producer.produce(
            topic, key=entry_key_bytes(entry), value=codec.encode(entry), partition=i % 2
        )
    assert producer.flush(30) == 0

    monkeypatch.setattr(recovery, "PROGRESS_INTERVAL", 0.0)
    monkeypatch.setattr(recovery, "BATCH", 100)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: log lines
    caches = {p: PartitionCache(tmp_path / f"p{p}") for p in (0, 1)}
    with caplog.at_level(logging.INFO, logger="agents_stream.state"):
        replayed = recovery.rebuild_partitions(broker.bootstrap, topic, caches, codec)
    assert replayed == {0: 750, 1: 750}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rebuild of")]
    assert len(lines) >= 2, lines
    assert all(line.startswith(f"rebuild of {topic}[0,1]: ") for line in lines)
    assert lines[-1].startswith(f"rebuild of {topic}[0,1]: 1,500/1,500 records (100%), ")
    assert "ETA" in lines[-1] and "/s" in lines[-1]
    for cache in caches.values():
        cache.close()
