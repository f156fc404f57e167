"""Exactly-once pieces of the store and caches that need no broker: which producer each
journal record goes to, the uncommitted mark of a cache and what reopening does with it.
(The transactions themselves are proven on Apache Kafka: tests/fault/test_transactions.py,
test_chaos.py, test_zombie.py.)"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from agents_stream import App
from agents_stream.durable.journal import ActionDone, ActionRef, CallEntry, CallStatus, Truncation
from agents_stream.errors import ConfigurationError
from agents_stream.kafka.config import transactional_config
from agents_stream.kafka.producer import AckingProducer
from agents_stream.serde.journal import default_journal_codec
from agents_stream.state.cache import UNCOMMITTED_KEY, PartitionCache
from agents_stream.state.kafka import KafkaActionStateStore


class Recording:
    """Stands in for a producer: what was sent (topic, partition), never connects."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int | None, int]] = []
        self.hooks: dict[str, Any] = {}

    def on_acked(self, topic: str, hook: Any) -> None:
        self.hooks[topic] = hook

    def _done(self) -> Future[None]:
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def send(self, topic: str, value: Any, *, key: Any = None, partition: Any = None) -> Any:
        self.sent.append((topic, partition, 1))
        return self._done()

    def send_all(self, topic: str, records: list[Any], *, partition: Any = None) -> Any:
        self.sent.append((topic, partition, len(records)))
        return self._done()


REF = ActionRef("k", 7, "A.run#0", 0, "in")


def _store(tmp_path: Path) -> tuple[KafkaActionStateStore, Recording, Recording]:
    journal, txn = Recording(), Recording()
    store = KafkaActionStateStore(
        topic="t-state",
        producer=journal,  # type: ignore[arg-type]
        codec=default_journal_codec(),
        data_dir=tmp_path,
        bootstrap="127.0.0.1:9",
    )
    store.use_transactions(txn)  # type: ignore[arg-type]
    store._caches[0] = PartitionCache(tmp_path / "p0")
    return store, journal, txn


def test_calls_and_truncations_stay_on_the_journal_producer_the_rest_is_transactional(
    tmp_path: Path,
) -> None:
    """Guarantee 1 cannot wait for a commit: a call's result is acknowledged before the
    action sees it, so it must not be in a transaction a crash aborts."""
    store, journal, txn = _store(tmp_path)
    call = CallEntry(REF, 0, "f", "d", CallStatus.SUCCEEDED, result=b"1")
    store.append([call], 0)
    store.append([Truncation(REF, 1, "f", "d", "g", "e", 1)], 0)
    assert [s[1] for s in journal.sent] == [0, 0] and txn.sent == []
    store.append([ActionDone(REF)], 0)
    assert txn.sent == [("t-state", 0, 1)]
    assert len(journal.sent) == 2
    assert store._caches[0].db.get(UNCOMMITTED_KEY) is not None
    store.committed()
    assert store._caches[0].db.get(UNCOMMITTED_KEY) is None
    store.close()


def test_a_partition_with_sends_queued_for_the_next_transaction_stays_uncommitted(
    tmp_path: Path,
) -> None:
    store, _, _ = _store(tmp_path)
    store.append([ActionDone(REF)], 0)
    store.committed(keep={0})
    assert store._caches[0].db.get(UNCOMMITTED_KEY) is not None
    store.close()


def test_no_emitted_markers_with_transactions(tmp_path: Path) -> None:
    """Outputs commit with their ActionDone: a committed one's outputs are in the log."""
    store, journal, txn = _store(tmp_path)
    store.note([ActionDone(REF)], 0)
    assert journal.sent == [] and txn.sent == []
    store.close()


def test_a_cache_reopened_with_the_uncommitted_mark_is_rebuilt_from_scratch(
    tmp_path: Path,
) -> None:
    """A worker that died mid-transaction left records in its cache that the broker
    aborted: the next open clears the cache (checkpoint 0: the rebuild reads the topic
    read_committed from the start)."""
    cache = PartitionCache(tmp_path / "p0")
    cache.apply([(b"a\x1fk\x1f7\x1fin\x1fA.run#0", b"done")], 42)
    cache.mark_uncommitted()
    cache.close()
    again = PartitionCache(tmp_path / "p0")
    assert again.checkpoint == 0
    assert again.get(b"a\x1fk\x1f7\x1fin\x1fA.run#0") is None
    again.apply([(b"a\x1fk\x1f7\x1fin\x1fA.run#0", b"done")], 43)
    again.close()
    clean = PartitionCache(tmp_path / "p0")  # never marked: kept
    assert clean.checkpoint == 43
    clean.close()


def test_processing_guarantee_is_validated_and_accepts_either_spelling() -> None:
    assert App("a").processing_guarantee == "at_least_once"
    assert App("a", processing_guarantee="exactly-once").exactly_once  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="processing_guarantee"):
        App("a", processing_guarantee="twice")  # type: ignore[arg-type]


def test_transactional_config_keeps_idempotence_and_bounds_a_dead_transaction() -> None:
    conf = transactional_config({"enable.idempotence": False, "linger.ms": 5}, "app-w1")
    assert conf["transactional.id"] == "app-w1"
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["transaction.timeout.ms"] == 10_000 and conf["linger.ms"] == 5
    assert (
        transactional_config({"transaction.timeout.ms": 3000}, "x")["transaction.timeout.ms"]
        == 3000
    )


def test_a_producer_without_transactional_id_is_refused() -> None:
    from agents_stream.kafka.transactions import TransactionalProducer

    with pytest.raises(ValueError, match=r"transactional\.id"):
        TransactionalProducer({"bootstrap.servers": "127.0.0.1:9"})
    assert isinstance(TransactionalProducer({"transactional.id": "x"}), AckingProducer)
