"""A revoke (or close) of a partition's cache while the producer's thread applies a
delivery report to it: the report finishes first, a later one finds the partition gone,
and no ack fails (a closed cache used to fail every ack of that poll, other partitions'
durable records included)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agents_stream.kafka.producer import Ack, AckingProducer
from agents_stream.serde.journal import default_journal_codec
from agents_stream.state.kafka import KafkaActionStateStore


class SlowCache:
    """Stands in for a PartitionCache: apply() parks until released; close() is noted."""

    def __init__(self) -> None:
        self.applying = threading.Event()
        self.release = threading.Event()
        self.closed = False
        self.applied: list[int] = []

    def apply(self, records: object, next_offset: int) -> None:
        assert not self.closed, "applied to a closed cache"
        self.applying.set()
        assert self.release.wait(5)
        self.applied.append(next_offset)

    def close(self) -> None:
        self.closed = True


def _store(tmp_path: Path) -> KafkaActionStateStore:
    producer = AckingProducer({"bootstrap.servers": "127.0.0.1:9"})  # never connects
    return KafkaActionStateStore(
        topic="t-state",
        producer=producer,
        codec=default_journal_codec(),
        data_dir=tmp_path,
        bootstrap="127.0.0.1:9",
    )


def _ack(partition: int, offset: int) -> Ack:
    return Ack("t-state", partition, offset, b"k", b"v", None)  # type: ignore[arg-type]


def test_a_revoke_waits_for_the_report_being_applied_and_later_reports_skip_it(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    cache = SlowCache()
    store._caches[0] = cache  # type: ignore[assignment]
    errors: list[BaseException] = []

    def hook(offset: int) -> None:
        try:
            store._on_acked([_ack(0, offset)])
        except BaseException as exc:  # the failure under test
            errors.append(exc)

    applying = threading.Thread(target=hook, args=(7,))
    applying.start()
    assert cache.applying.wait(5)
    revoking = threading.Thread(target=store.revoke, args=(0,))
    revoking.start()
    revoking.join(0.2)
    assert revoking.is_alive(), "the cache was closed while a report was being applied"
    cache.release.set()
    applying.join(5)
    revoking.join(5)
    assert cache.closed and cache.applied == [8]
    hook(9)  # a report that arrives after the revoke: skipped, not failed
    assert errors == [] and cache.applied == [8]


def test_close_waits_for_the_report_being_applied(tmp_path: Path) -> None:
    store = _store(tmp_path)
    cache = SlowCache()
    store._caches[0] = cache  # type: ignore[assignment]
    applying = threading.Thread(target=store._on_acked, args=([_ack(0, 3)],))
    applying.start()
    assert cache.applying.wait(5)
    closing = threading.Thread(target=store.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()
    cache.release.set()
    applying.join(5)
    closing.join(5)
    assert cache.closed and cache.applied == [4]


def test_an_ack_arriving_while_the_partition_is_assigned_reaches_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append of the partition in flight from an earlier ownership, acked after the
    rebuild read the topic's end but before the cache was in place, was dropped, and
    later acks moved the checkpoint past it: the cache never held that record (a replay
    would have run its acked call again)."""
    from agents_stream.state import kafka as kafka_store

    store = _store(tmp_path)

    def rebuild(bootstrap, topic, caches, codec, cancel=None, transactional=False):  # type: ignore[no-untyped-def]
        for cache in caches.values():
            cache.apply([(b"c\x1fk\x1f1\x1fin\x1fA.run#0\x1f0", b"old")], 5)
        store._on_acked([Ack("t-state", 0, 5, b"c\x1fk\x1f1\x1fin\x1fA.run#0\x1f0", b"new", None)])  # type: ignore[arg-type]
        return dict.fromkeys(caches, 1)

    monkeypatch.setattr(kafka_store, "rebuild_partitions", rebuild)
    store.assign(0)
    cache = store._caches[0]
    assert cache.get(b"c\x1fk\x1f1\x1fin\x1fA.run#0\x1f0") == b"new"
    assert cache.checkpoint == 6
    assert store._assigning == {}
    store.close()


def test_an_idle_store_flushes_its_caches_on_its_own_and_never_a_closed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes skip RocksDB's log: the store's flusher persists them once due, even when
    no later write comes (an idle worker), under the lock a revoke closes a cache with."""
    from agents_stream.state import cache as cache_module
    from agents_stream.state import kafka as kafka_module

    monkeypatch.setattr(cache_module, "FLUSH_EVERY_S", 0.05)
    monkeypatch.setattr(kafka_module, "FLUSH_EVERY_S", 0.05)
    store = _store(tmp_path)
    real = cache_module.PartitionCache(tmp_path / "p0")
    flushed = threading.Event()
    flush = real.flush_if_due

    def noted(now: float) -> bool:
        done = flush(now)
        if done:
            flushed.set()
        return done

    real.flush_if_due = noted  # type: ignore[method-assign]
    store._caches[0] = real
    store._start_flusher()
    store._on_acked([_ack(0, 4)])
    assert flushed.wait(5), "an idle store never flushed its cache"
    store.revoke(0)
    flushed.clear()
    store._on_acked([_ack(0, 5)])  # revoked: skipped, and nothing left to flush
    assert not flushed.wait(0.3)
    store.close()
    assert store._flusher is not None
    store._flusher.join(5)
    assert not store._flusher.is_alive()
    reopened = cache_module.PartitionCache(tmp_path / "p0")
    assert reopened.checkpoint == 5 and reopened.db.get(b"k") == b"v"
    reopened.close()
