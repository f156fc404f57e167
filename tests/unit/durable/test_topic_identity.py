"""Guarantee 8 (identity half): the input topic is part of an action run's identity.

One Agent bound to two input topics meets the same partition/offset on both: each record
runs (side effects counted), pruning one topic's record leaves the other's, and entries
journaled before v5 (keyed without a topic) still replay after the upgrade. Parametrized
over the in-memory store and the Kafka store (RocksDB cache, acks from a fake producer).
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable import ActionRef, CallStatus, ContextConfig
from agents_stream.durable.identity import args_digest, function_id
from agents_stream.durable.journal import CallEntry
from agents_stream.durable.keys import call_key, entry_key_bytes
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.kafka.producer import Ack
from agents_stream.serde.journal import default_journal_codec
from agents_stream.state import InMemoryActionStateStore
from agents_stream.state.kafka import KafkaActionStateStore

POOL = ThreadPoolExecutor(2)
CFG = ContextConfig(app_id="app", worker_id="w1", codec=JSON, executor=POOL)
CHARGES: list[tuple[str, int]] = []


def charge(call_id: str, amount: int) -> str:
    CHARGES.append((call_id, amount))
    return call_id


class Billing(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        receipt = ctx.execute(charge, event.input["amount"])
        ctx.send_event(OutputEvent(output={"receipt": receipt}))


class FakeProducer:
    """Acks every send at once, in order, like a broker would (one offset per record)."""

    def __init__(self) -> None:
        self._hooks: dict = {}
        self._offsets = itertools.count()

    def on_acked(self, topic, hook) -> None:
        self._hooks[topic] = hook

    def send(self, topic, value, *, key=None, partition=0) -> Future[None]:
        fut: Future[None] = Future()
        self._hooks[topic]([Ack(topic, partition, next(self._offsets), key, value, fut)])
        fut.set_result(None)
        return fut

    def send_untracked(self, topic, records, partition) -> Future[None]:
        return self.send_all(topic, records, partition=partition)

    def send_all(self, topic, records, *, partition=0) -> Future[None]:
        for key, value in records:
            self.send(topic, value, key=key, partition=partition)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


@pytest.fixture(params=["memory", "kafka"])
def store(request, tmp_path: Path):
    CHARGES.clear()
    if request.param == "memory":
        yield InMemoryActionStateStore()
        return
    producer = FakeProducer()
    kafka_store = KafkaActionStateStore(
        topic="app-action-state",
        producer=producer,  # type: ignore[arg-type]
        codec=default_journal_codec(),
        data_dir=tmp_path,
        bootstrap="unused:9092",
    )
    # Caches opened directly: nothing to catch up from a topic.
    from agents_stream.state.cache import PartitionCache

    kafka_store._caches[0] = PartitionCache(tmp_path / "p0")
    yield kafka_store
    kafka_store.close()


def run(store, topic: str, seq: int, amount: int, key: str = "k"):
    runner = ActionRunner(Billing, store, CFG, topic=topic)
    return asyncio.run(runner.run(RecordInput(key, seq, {"amount": amount}, 0)))


def test_same_offset_on_two_topics_runs_both(store):
    first = run(store, "orders", 5, 10)
    second = run(store, "refunds", 5, 20)
    assert [a for _, a in CHARGES] == [10, 20]
    assert first.actions_run == second.actions_run == 1
    assert first.outputs != second.outputs  # distinct call ids, topic included
    assert CHARGES[0][0] == "app:orders:k:5:Billing.process#0:0"
    # Re-consuming either record replays, never charges again.
    assert run(store, "orders", 5, 10).actions_skipped == 1
    assert run(store, "refunds", 5, 20).actions_skipped == 1
    assert len(CHARGES) == 2


def test_pruning_one_topic_leaves_the_other(store):
    run(store, "orders", 5, 10)
    run(store, "refunds", 5, 20)
    store.prune("k", 5, 0, "orders")
    assert store.done(ActionRef("k", 5, "Billing.process#0", 0, "orders")) is None
    assert store.done(ActionRef("k", 5, "Billing.process#0", 0, "refunds")) is not None
    assert run(store, "refunds", 5, 20).actions_skipped == 1
    assert len(CHARGES) == 2


def legacy_pending_slot(store, seq: int) -> str:
    """A call journaled by a pre-v5 worker (no topic in key or value), still in flight."""
    legacy = ActionRef("k", seq, "Billing.process#0", 0)
    entry = CallEntry(
        ref=legacy,
        index=0,
        function_id=function_id(charge),
        args_digest=args_digest((7,), {}),
        status=CallStatus.SUCCEEDED,
        result=JSON.encode(legacy.call_id("app", 0)),
        call_id=legacy.call_id("app", 0),
    )
    assert entry_key_bytes(entry) == call_key(legacy, 0)  # the pre-v5 key layout
    store.append([entry], 0).result()
    return legacy.call_id("app", 0)


def test_legacy_entries_replay_after_upgrade(store):
    store.legacy_topics = frozenset(["orders"])
    old_id = legacy_pending_slot(store, 9)
    outcome = run(store, "orders", 9, 7)
    assert CHARGES == []  # replayed from the pre-v5 slot
    assert outcome.calls_replayed == 1
    assert outcome.outputs == [{"receipt": old_id}]  # same call id as before the upgrade
    assert old_id == "app:k:9:Billing.process#0:0"
    # The run finished under its legacy identity; pruning the topic removes it.
    store.prune("k", 9, 0, "orders")
    assert store.calls(ActionRef("k", 9, "Billing.process#0", 0)) == {}
    assert store.done(ActionRef("k", 9, "Billing.process#0", 0)) is None


def test_legacy_entries_belong_to_the_legacy_topic_only(store):
    store.legacy_topics = frozenset(["orders"])
    legacy_pending_slot(store, 9)
    run(store, "refunds", 9, 7)
    assert [a for _, a in CHARGES] == [7]  # another topic never meets the old slot
    store.prune("k", 9, 0, "refunds")
    assert store.calls(ActionRef("k", 9, "Billing.process#0", 0))  # orders' slot stays
