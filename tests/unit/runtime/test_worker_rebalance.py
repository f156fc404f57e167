"""Rebalance callbacks without a broker: lost partitions are dropped without a commit or a
completed-through marker, revoked ones are committed first, an empty incremental
assignment is a no-op, and a cache rebuild cancelled by a stop takes no partition."""

from __future__ import annotations

import asyncio

from confluent_kafka import TopicPartition

from agents_stream.host.progress import CompletedThrough
from agents_stream.runtime.commit import AtLeastOnceCommit
from agents_stream.runtime.controller import ExecutionController
from agents_stream.runtime.timers import Firings
from agents_stream.state.recovery import RebuildCancelled
from tests.unit.runtime.test_worker_commits import (
    TP,
    FakeAgentHost,
    FakeConsumer,
    FakeStore,
    bind,
    finish,
    make_worker,
)


class Store(FakeStore):
    def __init__(self, assign_error: BaseException | None = None) -> None:
        super().__init__()
        self.revoked: list[int] = []
        self.assign_error = assign_error

    def revoke(self, partition: int) -> None:
        self.revoked.append(partition)

    def assign(self, *partitions: int) -> int:
        if self.assign_error is not None:
            raise self.assign_error
        return 0


def rebalance_worker(tmp_path, store: Store):
    worker = make_worker(tmp_path, FakeConsumer())
    worker.store = store  # type: ignore[assignment]
    worker.progress = CompletedThrough(store, "w", rerun_completed=False)  # type: ignore[arg-type]
    worker.committer = AtLeastOnceCommit(worker.consumer, worker.progress, 1.0)
    worker._agents = {"in": FakeAgentHost()}  # type: ignore[dict-item]
    worker._watermarks = {}
    worker._async_ios = {}
    worker.rebalance.state_refs[TP[1]] = 1
    return worker


def drive(worker, callback, partitions) -> None:
    async def main():
        await bind(worker)
        worker.controller = ExecutionController(10)
        worker.firings = Firings(
            worker.timers, worker._agents, worker.controller, worker.partitions, worker.stats
        )
        finish(worker, 0, "k0")
        finish(worker, 1, "k1")
        await worker._on_kafka(callback, worker.consumer, partitions)
        worker._kafka.shutdown(wait=True)

    asyncio.run(main())


def test_lost_partition_is_dropped_without_commit_or_marker(tmp_path):
    store = Store()
    worker = rebalance_worker(tmp_path, store)
    drive(worker, worker.rebalance.on_lost, [TopicPartition(*TP)])
    assert worker.consumer.commits == []  # type: ignore[attr-defined]
    assert store.markers == [] and store.pruned == []
    assert TP not in worker.partitions and store.revoked == [0]


def test_revoked_partition_is_committed_and_marked_first(tmp_path):
    store = Store()
    worker = rebalance_worker(tmp_path, store)
    drive(worker, worker.rebalance.on_revoke, [TopicPartition(*TP)])
    assert worker.consumer.commits == [{TP: 2}]  # type: ignore[attr-defined]
    assert [m.offset for m in store.markers] == [2]
    assert TP not in worker.partitions and store.revoked == [0]


def test_empty_incremental_assignment_changes_nothing(tmp_path):
    worker = rebalance_worker(tmp_path, Store(assign_error=AssertionError("no rebuild")))
    worker.rebalance.on_assign(worker.consumer, [])  # type: ignore[arg-type]
    assert set(worker.partitions) == {TP} and worker.rebuilding == 0


def test_assignment_whose_rebuild_is_cancelled_takes_no_partition(tmp_path):
    store = Store(assign_error=RebuildCancelled("cancelled after 10 records"))
    worker = rebalance_worker(tmp_path, store)
    worker.partitions.clear()
    worker.rebalance.state_refs.clear()
    worker.rebalance.on_assign(worker.consumer, [TopicPartition("in", 1)])  # type: ignore[arg-type]
    assert worker.partitions == {} and worker.rebuilding == 0
    assert worker.rebalance.state_refs.get(1, 0) == 0  # no cache held for it
