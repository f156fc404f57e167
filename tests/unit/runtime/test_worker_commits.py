"""Worker commit protocol without a broker: which thread touches what, and failures.

The offset and finished-record bookkeeping is mutated on the event loop as records
finish; the consumer lives on the kafka thread. These tests drive ``Commits.run`` with
a fake consumer and store and check that the bookkeeping never crosses threads, that
records finishing during a commit survive its prune, and that a commit loop that dies
stops the worker with a non-zero exit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import KafkaError, TopicPartition

from agents_stream import Agent, App, InputEvent, RunnerContext, action
from agents_stream.durable.store import completed_future
from agents_stream.host.progress import CompletedThrough
from agents_stream.runtime.commit import AtLeastOnceCommit
from agents_stream.runtime.offsets import PartitionOffsets
from agents_stream.runtime.partition import Partition
from agents_stream.runtime.worker import Worker

TP = ("in", 0)


class Echo(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event: InputEvent, ctx: RunnerContext) -> None:
        pass


class FakeConsumer:
    def __init__(self, failures: list[BaseException] | None = None) -> None:
        self.failures = list(failures or [])
        self.commits: list[dict[tuple[str, int], int]] = []
        self.gate: threading.Event | None = None  # set: commit returns
        self.entered = threading.Event()
        self.modes: list[bool] = []  # asynchronous= of each commit call

    def commit(self, offsets, asynchronous):
        self.modes.append(asynchronous)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(5), "test never released the commit"
        if self.failures:
            raise self.failures.pop(0)
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})


class FakeStore:
    def __init__(self) -> None:
        self.pruned: list[tuple[str, int, int]] = []

        self.markers: list = []

    def append(self, entries, partition):
        self.markers.extend(entries)
        return completed_future()

    def prune(self, key: str, seq: int, partition: int, topic: str = "") -> None:
        # Pruning is only allowed below a marker that was already written (acked).
        assert self.markers and self.markers[-1].offset > seq
        self.pruned.append((key, seq, partition))

    def prune_records(self, records, partition: int, topic: str = "") -> None:
        for seq, key in records:
            self.prune(key, seq, partition, topic)


class LoopOnlyOffsets(PartitionOffsets):
    """Offsets that must only be read on the loop's thread."""

    def __init__(self, owner: threading.Thread, fail: BaseException | None) -> None:
        super().__init__()
        self.owner = owner
        self.fail = fail
        self.foreign: list[str] = []

    def committable(self) -> int | None:
        if threading.current_thread() is not self.owner:
            self.foreign.append(threading.current_thread().name)
        if self.fail is not None:
            raise self.fail
        return super().committable()


class LoopOnlyPartition(Partition):
    """A partition whose finished records must only be touched on the loop's thread."""

    foreign: list[str]

    def _check(self, what: str) -> None:
        if threading.current_thread() is not self.owner:
            self.foreign.append(f"{what} on {threading.current_thread().name}")

    def finish(self, offset: int, key: str, ok: bool) -> None:
        self._check("finish")
        super().finish(offset, key, ok)

    def committed(self, position: int) -> list[tuple[int, str]]:
        self._check("committed")
        return super().committed(position)


def hold(worker: Worker, offsets_fail: BaseException | None = None) -> LoopOnlyPartition:
    """What the assignment does: TP held, its bookkeeping loop-only."""
    part = LoopOnlyPartition(
        *TP, host=None, watermarks=None, first_expected=-1, arm_at=None,
        seek=lambda p, o: None, stats=worker.stats,
    )  # fmt: skip
    part.owner = threading.current_thread()
    part.foreign = []
    part.offsets = LoopOnlyOffsets(part.owner, offsets_fail)
    worker.partitions[TP] = part
    worker.ownership.acquire(*TP)
    return part


def make_worker(tmp_path, consumer: FakeConsumer, offsets_fail: BaseException | None = None):
    app = App("unit-commits", commit_interval=0.01)
    app.agent(Echo, input="in")
    worker = Worker(app, broker="127.0.0.1:1", data_dir=tmp_path)
    worker.consumer = consumer  # type: ignore[assignment]
    worker.store = FakeStore()  # type: ignore[assignment]
    worker._agents = {"in": object()}  # type: ignore[dict-item]
    hold(worker, offsets_fail)
    worker.progress = CompletedThrough(worker.store, "w", rerun_completed=False)  # type: ignore[arg-type]
    worker.committer = AtLeastOnceCommit(consumer, worker.progress, 1.0)  # type: ignore[arg-type]
    return worker


def finish(worker: Worker, offset: int, key: str) -> None:
    """What the worker does on the loop when a record finished."""
    part = worker.partitions[TP]
    part.offsets.start(offset)
    part.finish(offset, key, True)


async def bind(worker: Worker) -> None:
    worker._loop = asyncio.get_running_loop()
    worker._stopping = asyncio.Event()


def test_records_finishing_during_a_commit_survive_its_prune(tmp_path):
    consumer = FakeConsumer()
    consumer.gate = threading.Event()
    worker = make_worker(tmp_path, consumer)

    async def main():
        await bind(worker)
        for offset in range(3):
            finish(worker, offset, f"k{offset}")
        loop = asyncio.create_task(worker.commits.run())
        await asyncio.get_running_loop().run_in_executor(None, consumer.entered.wait, 5)
        for offset in range(3, 6):  # finish while the commit call is in flight
            finish(worker, offset, f"k{offset}")
        consumer.gate.set()
        # The prune follows the commit on the Kafka thread: wait for it too,
        # or the cancel below races it.
        while len(consumer.commits) < 2 or len(worker.store.pruned) < 6:
            await asyncio.sleep(0.01)
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        worker._kafka.shutdown(wait=True)

    asyncio.run(main())
    assert consumer.commits[0] == {TP: 3}
    assert consumer.commits[1] == {TP: 6}
    assert sorted(worker.store.pruned) == [(f"k{o}", o, 0) for o in range(6)]
    assert [(m.topic, m.partition, m.offset) for m in worker.store.markers] == [
        ("in", 0, 3),
        ("in", 0, 6),
    ]
    part = worker.partitions[TP]
    assert part.finished == []
    assert part.foreign == [], "finished records touched off the loop"
    assert part.offsets.foreign == [], "offsets read off the loop"
    assert worker.exit_code == 0


def test_a_kafka_commit_error_is_retried(tmp_path, caplog):
    consumer = FakeConsumer(failures=[RuntimeError("broker went away")])
    worker = make_worker(tmp_path, consumer)

    async def main():
        await bind(worker)
        finish(worker, 0, "k")
        loop = asyncio.create_task(worker.commits.run())
        for _ in range(300):
            if consumer.commits:
                break
            await asyncio.sleep(0.01)
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        worker._kafka.shutdown(wait=True)

    with caplog.at_level(logging.WARNING, "agents_stream.worker"):
        asyncio.run(main())
    assert consumer.commits == [{TP: 1}]
    assert "will retry" in caplog.text and worker.exit_code == 0
    # The periodic commit does not wait for the broker (a rebalance in progress would
    # stall every partition's commit loop behind it).
    assert set(consumer.modes) == {True}


def test_a_failed_asynchronous_commit_is_retried(tmp_path, caplog):
    """The broker's answer to an asynchronous commit arrives in the commit callback: a
    failure makes its offsets committable again."""
    consumer = FakeConsumer()
    worker = make_worker(tmp_path, consumer)

    async def main():
        await bind(worker)
        worker._loop = asyncio.get_running_loop()
        finish(worker, 0, "k")
        await worker.commits.commit(None, asynchronous=True)
        assert worker.commits.committable(None) == {}
        worker.commits.commit_done(None, [TopicPartition(*TP, 1)])  # landed: nothing to redo
        await asyncio.sleep(0.01)
        assert worker.commits.committable(None) == {}
        error = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
        worker.commits.commit_done(error, [TopicPartition(*TP, 1)])
        await asyncio.sleep(0.01)  # the retry mark is made on the loop
        assert worker.commits.committable(None) == {TP: 1}
        worker._kafka.shutdown(wait=True)

    with caplog.at_level(logging.WARNING, "agents_stream.worker"):
        asyncio.run(main())
    assert "retried by the next commit" in caplog.text


def test_records_below_its_own_marker_are_skipped_if_handed_over_again(tmp_path):
    """Once a commit's marker is acked its records may be pruned: if the client hands
    them over again (Apache Kafka did, from the last committed offset, after a failed
    asynchronous commit), they are skipped like those below a marker found on
    assignment, never run again with their journal gone."""
    consumer = FakeConsumer()
    worker = make_worker(tmp_path, consumer)

    async def main():
        await bind(worker)
        for offset in range(3):
            finish(worker, offset, f"k{offset}")
        await worker.commits.commit(None, asynchronous=True)
        worker._kafka.shutdown(wait=True)

    asyncio.run(main())
    assert worker.store.pruned and worker.progress.through == {TP: 3}
    rerun = App("unit-commits-rerun", rerun_completed=True)
    rerun.agent(Echo, input="in")
    worker.app = rerun  # rerun_completed: records below markers run again, as asked
    worker.progress = CompletedThrough(worker.store, "w", rerun_completed=True)  # type: ignore[arg-type]
    worker.committer = AtLeastOnceCommit(consumer, worker.progress, 1.0)  # type: ignore[arg-type]

    async def again():
        await bind(worker)
        worker._kafka = ThreadPoolExecutor(1)  # the first run shut its own down
        finish(worker, 3, "k3")
        await worker.commits.commit(None, asynchronous=True)
        worker._kafka.shutdown(wait=True)

    asyncio.run(again())
    assert worker.progress.through == {}


@pytest.mark.parametrize(
    "fail",
    [RuntimeError("dictionary changed size during iteration"), KeyError(("in", 0))],
    ids=["runtime-error", "key-error"],
)
def test_a_crashing_commit_loop_stops_the_worker_non_zero(tmp_path, caplog, fail):
    worker = make_worker(tmp_path, FakeConsumer(), offsets_fail=fail)

    async def main():
        await bind(worker)
        finish(worker, 0, "k")
        loop = asyncio.create_task(worker.commits.run())
        try:
            await asyncio.wait_for(worker._stopping.wait(), 2)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            worker._kafka.shutdown(wait=True)

    with caplog.at_level(logging.ERROR, "agents_stream.worker"):
        asyncio.run(main())
    assert worker.exit_code != 0
    assert "commit loop" in caplog.text and "stopping" in caplog.text


class FakeAgentHost:
    """Stands in for AgentHost: records run on the controller, timers are recorded."""

    name = "echo"

    def __init__(self) -> None:
        self.binding = self
        self.fired: list[tuple[str, int]] = []

    async def handle_timer(self, timer) -> None:
        self.fired.append((timer.key, timer.ts))


def test_a_revoked_partition_fires_no_timer_after_the_revoke(tmp_path):
    from confluent_kafka import TopicPartition

    from agents_stream.durable.journal import TimerEntry
    from agents_stream.runtime.controller import ExecutionController
    from agents_stream.runtime.timers import Firings

    worker = make_worker(tmp_path, FakeConsumer())
    worker.store = None
    host = FakeAgentHost()
    worker._agents = {"in": host}  # type: ignore[dict-item]
    worker._watermarks = {}
    worker._async_ios = {}
    worker.timers.load("echo", 0, [TimerEntry("k", "event", 5, "echo", 0)], armed=True)

    async def main():
        await bind(worker)
        worker.controller = ExecutionController(10)
        worker.firings = Firings(
            worker.timers, worker._agents, worker.controller, worker.partitions, worker.stats
        )
        worker.partitions[TP].offsets.start(0)

        async def record() -> None:
            await asyncio.sleep(0.05)

        worker.controller.submit("r", TP, record, lambda ok: None)
        # Due once the record finishes, i.e. while the revoke drains partition 0.
        worker.controller.watermark(10, lambda wm: worker.firings.watermark_done("in", wm))
        await worker._on_kafka(worker.rebalance.on_revoke, worker.consumer, [TopicPartition(*TP)])
        await asyncio.sleep(0.05)
        await worker.controller.join()
        worker._kafka.shutdown(wait=True)

    asyncio.run(main())
    assert host.fired == [], "a revoked partition's timer fired (the next owner fires it)"
    assert TP not in worker.partitions and worker.timers.pending() == 0
