"""The group commit against rebalances, every interleaving hypothesis finds, no broker.

A commit is two steps on two threads: the loop snapshots the committable offsets
(``Commits.committable``), and later the kafka thread makes them durable
(``Commits.group_commit``). Rebalance callbacks run on the kafka thread too, between
those steps: a partition may be revoked (its own synchronous commit, then released),
lost (released, nothing committed), assigned again (a new hold), or every hold may be
suspended (a freeze). Found on a cluster: a snapshot that outlived a revoke made the
commit write a completed-through marker for a partition no longer held, the ownership
check refused it, and the worker stopped (issue 50).

The model: per partition, the hold (a generation), the offset records finished
through, and the group's committed offset. Checked after every step, for both commits
(at-least-once offsets + markers, and the transactional one):

* a commit never raises anything but ``TransactionFailed`` (exactly-once, holds suspended);
* it commits (offsets and markers) only partitions held under the hold of its snapshot;
* the group's committed offset of a partition never moves back, and never passes the
  records finished under the hold that committed it;
* every marker is appended while its partition is held (the real store's check).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream import Agent, App, InputEvent, RunnerContext, action
from agents_stream.durable.journal import InputProgress
from agents_stream.durable.ownership import Ownership
from agents_stream.durable.store import completed_future
from agents_stream.host.progress import CompletedThrough
from agents_stream.kafka.transactions import TransactionFailed
from agents_stream.runtime.commit import AtLeastOnceCommit, TransactionalCommit
from agents_stream.runtime.worker import Worker
from agents_stream.runtime.worker_commits import Snapshot

TOPIC = "in"
PARTITIONS = (0, 1)


class Echo(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event: InputEvent, ctx: RunnerContext) -> None:
        pass


class Group:
    """The broker's side: the group's committed offsets, as the coordinator keeps them."""

    def __init__(self) -> None:
        self.committed: dict[int, int] = {}
        self.history: list[tuple[int, int]] = []

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        for (_, partition), offset in offsets.items():
            self.committed[partition] = offset
            self.history.append((partition, offset))


class Consumer:
    def __init__(self, group: Group) -> None:
        self.group = group

    def commit(self, offsets: Any, asynchronous: bool) -> None:
        self.group.commit({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def consumer_group_metadata(self) -> object:
        return object()


class Transactions:
    """The transactional producer's commit: runs ``before`` (the last ownership look),
    then commits the offsets with the transaction."""

    sent = 0

    def __init__(self, group: Group) -> None:
        self.group = group

    def commit(self, offsets: Any, metadata: Any, *, before: Any = None, after: Any = None):
        if before is not None:
            before()
        self.group.commit({(tp.topic, tp.partition): tp.offset for tp in offsets})
        if after is not None:
            after(set())


class Store:
    """Marker appends checked as the real store checks them (state/kafka.py)."""

    topic = "state"

    def __init__(self, ownership: Ownership) -> None:
        self.ownership = ownership
        self.markers: list[InputProgress] = []

    def append(self, entries: Sequence[InputProgress], partition: int):
        self.ownership.check_partition(partition, "journal write")
        self.markers.extend(entries)
        return completed_future()

    def committed(self, partitions: set[int]) -> None:
        pass

    def prune_records(self, records: Any, partition: int, topic: str = "") -> None:
        pass


def make_worker(tmp_path: Any, exactly_once: bool) -> tuple[Worker, Group, Store]:
    app = App("unit-interleave")
    app.agent(Echo, input=TOPIC)
    worker = Worker(app, broker="127.0.0.1:1", data_dir=tmp_path)
    group = Group()
    worker._agents = {TOPIC: SimpleNamespace(kept=None)}  # type: ignore[dict-item]
    worker._watermarks = {}
    worker.ownership = Ownership()
    store = Store(worker.ownership)
    worker.store = store  # type: ignore[assignment]
    worker.progress = CompletedThrough(store, "w", rerun_completed=False)  # type: ignore[arg-type]
    consumer = Consumer(group)
    worker.consumer = consumer  # type: ignore[assignment]
    if exactly_once:
        worker.committer = TransactionalCommit(
            consumer,  # type: ignore[arg-type]
            Transactions(group),  # type: ignore[arg-type]
            store,  # type: ignore[arg-type]
            worker.ownership,
        )
    else:
        worker.committer = AtLeastOnceCommit(consumer, worker.progress, 1.0)  # type: ignore[arg-type]
    return worker, group, store


steps = st.lists(
    st.one_of(
        st.tuples(st.just("finish"), st.sampled_from(PARTITIONS), st.integers(1, 5)),
        st.tuples(st.just("snapshot"), st.none(), st.none()),
        st.tuples(st.just("commit"), st.none(), st.none()),
        st.tuples(st.just("revoke"), st.sampled_from(PARTITIONS), st.none()),
        st.tuples(st.just("lose"), st.sampled_from(PARTITIONS), st.none()),
        st.tuples(st.just("assign"), st.sampled_from(PARTITIONS), st.none()),
        st.tuples(st.just("suspend"), st.none(), st.none()),
        st.tuples(st.just("resume"), st.none(), st.none()),
    ),
    min_size=8,
    max_size=50,
)


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=steps)
def test_commit_against_revoke_and_loss(tmp_path, exactly_once, steps):
    worker, group, store = make_worker(tmp_path, exactly_once)
    commits = worker.commits
    ownership = worker.ownership
    # The model: the current hold of each partition (0: not held), the offset finished
    # through under it, and what the group's offset may be at most.
    hold: dict[int, int] = {}
    finished: dict[int, int] = {}
    highest_finished: dict[int, int] = defaultdict(int)  # over every hold: the next owner's
    pending: list[Snapshot] = []

    def assign(p: int) -> None:
        hold[p] = ownership.acquire(TOPIC, p)
        part = worker.partitions[(TOPIC, p)] = worker.rebalance.held(TOPIC, p, -1, None)
        # A new owner starts from the group's committed offset.
        start = group.committed.get(p, 0)
        finished[p] = start
        part.offsets.committed = start - 1

    def release(p: int) -> None:
        ownership.release(TOPIC, p)
        worker.partitions.pop((TOPIC, p), None)
        hold.pop(p, None)

    def commit(snapshot: Snapshot) -> None:
        before = dict(group.committed)
        markers_before = len(store.markers)
        try:
            _, held = commits.group_commit(snapshot, False)
        except TransactionFailed:
            # Only a suspension of every hold makes the transactional commit give up.
            assert exactly_once and ownership.suspended is not None
            assert group.committed == before
            return
        commits.committed(held)
        for (_, p), offset in held.items():
            # Held, under the hold its snapshot was taken with.
            assert hold.get(p) == snapshot.leases[(TOPIC, p)]
            assert offset <= finished[p]
        for partition, offset in group.committed.items():
            if (TOPIC, partition) not in held:
                assert before.get(partition) == offset, f"{partition} committed, not held"
        for marker in store.markers[markers_before:]:
            assert (TOPIC, marker.partition) in held

    for p in PARTITIONS:
        assign(p)
    for op, p, n in steps:
        if op == "finish" and p in hold:
            tracker = worker.partitions[(TOPIC, p)].offsets
            for _ in range(n):
                offset = finished[p]
                tracker.start(offset)
                tracker.finish(offset)
                finished[p] = offset + 1
                highest_finished[p] = max(highest_finished[p], offset + 1)
        elif op == "snapshot":
            pending.append(commits.committable(None))
        elif op == "commit" and pending:
            # In the order the snapshots were taken: one kafka thread runs the commits,
            # first in first out (a later snapshot's commit never overtakes an earlier).
            commit(pending.pop(0))
        elif op == "revoke" and p in hold:
            # Cooperative revoke (worker_rebalance.on_revoke): its own commit, then release.
            if ownership.suspended is None:
                commit(commits.committable({(TOPIC, p)}))
            release(p)
        elif op == "lose" and p in hold:
            release(p)  # fenced at once, nothing committed
        elif op == "assign" and p not in hold:
            assign(p)
        elif op == "suspend":
            ownership.suspend("frozen")
        elif op == "resume":
            ownership.resume()
        # The group's offsets never move back, and never pass what was finished.
        for partition, offset in group.committed.items():
            assert offset <= highest_finished[partition]
        seen: dict[int, int] = {}
        for partition, offset in group.history:
            assert offset >= seen.get(partition, 0), f"partition {partition} moved back"
            seen[partition] = offset


def test_a_transaction_with_no_offset_moved_still_carries_the_group_metadata(tmp_path):
    """A transaction with records and no offset moved (a slow record holding its
    partition back) commits every interval. Committed with no offsets, the coordinator
    would not check the member's generation: a member that lost its partitions and has
    not heard yet would commit outputs their next owner sends again. So the unchanged
    positions go with it (and no completed-through marker: nothing new finished)."""
    import asyncio

    worker, _group, store = make_worker(tmp_path, exactly_once=True)
    transactions = worker.committer._producer  # type: ignore[attr-defined]
    seen: list[dict[tuple[str, int], int]] = []
    commit = transactions.commit

    def recording(offsets: Any, metadata: Any, **kw: Any) -> None:
        seen.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        commit(offsets, metadata, **kw)

    transactions.commit = recording

    async def on_kafka(fn: Any, *args: Any) -> Any:
        return fn(*args)

    worker._on_kafka = on_kafka  # type: ignore[method-assign]
    for p in PARTITIONS:
        worker.ownership.acquire(TOPIC, p)
        part = worker.partitions[(TOPIC, p)] = worker.rebalance.held(TOPIC, p, -1, None)
        for offset in range(3):
            part.offsets.start(offset)
        part.offsets.finish(0)
    asyncio.run(worker.commits.commit(None))
    assert seen == [{(TOPIC, 0): 1, (TOPIC, 1): 1}]
    assert len(store.markers) == 2
    # Offset 1 still runs: nothing moved. With records in the transaction, it commits
    # with the positions again; without, nothing commits.
    transactions.sent = 5
    asyncio.run(worker.commits.commit(None))
    assert seen[-1] == {(TOPIC, 0): 1, (TOPIC, 1): 1}
    assert len(store.markers) == 2
    transactions.sent = 0
    asyncio.run(worker.commits.commit(None))
    assert len(seen) == 2
