"""A rebuild takes whole batches column by column when they are all clean (current
schema, keys set, open partitions, nothing unresolved) and record by record otherwise;
both must leave the same cache: every key's last value, tombstones applied, checkpoints
at the partition ends."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from confluent_kafka import Producer

from agents_stream.durable.journal import ActionDone, ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde import default_journal_codec
from agents_stream.state import recovery
from agents_stream.state.cache import CHECKPOINT_KEY, PartitionCache

pytestmark = pytest.mark.broker


def fill(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, int]:
    """Calls, ActionDones (some under legacy keys) and tombstones of earlier keys, mixed
    over ``partitions``; returns records per partition."""
    codec = default_journal_codec()
    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    written: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    counts = dict.fromkeys(range(partitions), 0)
    for i in range(count):
        p = rng.randrange(partitions)
        if written[p] and rng.random() < 0.1:
            key, value = rng.choice(written[p]), None
        else:
            ref = ActionRef(f"k{i % 97}", i, "A.process#0", p, "" if i % 50 == 0 else "orders")
            entry = (
                ActionDone(ref, outputs=(b'{"n": 1}',), calls=1)
                if i % 3 == 0
                else CallEntry(ref, i % 3, "f", "d", CallStatus.SUCCEEDED, b"1")
            )
            key, value = entry_key_bytes(entry), codec.encode(entry)
            written[p].append(key)
        producer.produce(topic, key=key, value=value, partition=p)
        counts[p] += 1
    assert producer.flush(30) == 0
    return counts


def contents(cache: PartitionCache) -> dict[bytes, bytes]:
    return dict(cache.db.items())


def test_batch_and_record_paths_build_the_same_cache(
    broker, topic_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = topic_factory("state")
    TopicAdmin(broker.bootstrap).ensure([compacted(topic, 2)])
    counts = fill(broker.bootstrap, topic, 2, 6000)
    codec = default_journal_codec()

    def rebuild(name: str) -> dict[int, PartitionCache]:
        caches = {p: PartitionCache(tmp_path / name / f"p{p}") for p in range(2)}
        replayed = recovery.rebuild_partitions(broker.bootstrap, topic, caches, codec)
        assert replayed == counts
        return caches

    batched = rebuild("batched")
    monkeypatch.setattr(recovery, "_clean_runs", lambda *args: None)
    recorded = rebuild("recorded")
    for p in range(2):
        assert contents(batched[p]) == contents(recorded[p])
        assert batched[p].checkpoint == counts[p]
        assert batched[p].has_legacy and recorded[p].has_legacy
        assert contents(batched[p])[CHECKPOINT_KEY] == str(counts[p]).encode()
    # Replayed batches skip RocksDB's log: the rebuild persisted them before returning.
    for caches in (batched, recorded):
        for cache in caches.values():
            assert not cache._unsettled
            cache.close()
    reopened = PartitionCache(tmp_path / "batched" / "p0")
    assert reopened.checkpoint == counts[0]
    reopened.close()
