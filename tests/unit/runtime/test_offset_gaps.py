"""A partition's offset gap check without a broker (runtime/partition.py): which records
of a partition being fetched again are dropped, how a gap is told skipped from real, and
that a failed seek or a revoke cannot leave a partition stuck (the broker side:
tests/integration/test_offset_gaps.py)."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from confluent_kafka import KafkaException, TopicPartition

from agents_stream import Agent, App, InputEvent, RunnerContext, action
from agents_stream.runtime.partition import Partition
from agents_stream.runtime.worker import Worker

TP = ("in", 0)


class Echo(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event: InputEvent, ctx: RunnerContext) -> None:
        pass


class NoReports:
    def serve_due(self) -> None:
        pass


def partition(first_expected: int = -1) -> tuple[Partition, list[int]]:
    seeks: list[int] = []
    part = Partition(
        *TP, host=None, watermarks=None, first_expected=first_expected, arm_at=None,
        seek=lambda p, offset: seeks.append(offset), stats=defaultdict(int),
    )  # fmt: skip
    return part, seeks


def test_records_fetched_before_the_seek_are_dropped_until_it_is_done() -> None:
    part, seeks = partition()
    assert part.accept(9, 0)
    assert not part.accept(15, 0)  # 10-14 missing: fetched again from 10
    assert seeks == [10]
    assert not part.accept(16, 0)  # same batch: fetched before the seek
    part.seeks_issued()  # the batch ended: the next consume is after the seek
    assert not part.accept(9, 0)  # already started before the gap
    assert part.accept(10, 0)  # the skipped records came back
    assert part._stats["offset_gaps_recovered"] == 1
    assert part.offsets.committable() == 9  # 9 and 10 in flight


def test_a_gap_seen_again_is_real_and_not_checked_again_until_a_rebalance() -> None:
    part, seeks = partition(first_expected=10)
    assert not part.accept(15, 0) and seeks == [10]
    part.seeks_issued()
    assert part.accept(15, 0)  # nothing at 10-14: transaction markers, compaction
    assert part._stats["offset_gaps_recovered"] == 0
    assert part.accept(20, 0)  # the same generation: taken as real, counted
    assert part._stats["offset_gaps"] == 2 and seeks == [10]  # 10-14 and 16-19
    assert not part.accept(30, 1)  # a rebalance since: checked again
    assert seeks == [10, 21]


def test_the_end_of_a_partition_is_checked_for_a_gap_too() -> None:
    part, seeks = partition(first_expected=0)
    assert not part.at_end(1, 0)  # EOF at 1 with nothing seen: offset 0 fetched again
    assert seeks == [0]
    assert not part.at_end(1, 0)  # the seek is not issued yet
    part.seeks_issued()
    assert part.at_end(1, 0)  # still nothing at 0: a real gap (a transaction marker)
    assert part.at_end(1, 0)


def test_a_failed_seek_lets_the_next_record_through(tmp_path, caplog) -> None:
    class FailingConsumer:
        def seek(self, tp: TopicPartition) -> None:
            raise KafkaException("partition not assigned")

    app = App("unit-gaps")
    app.agent(Echo, input="in")
    worker = Worker(app, broker="127.0.0.1:1", data_dir=tmp_path)
    worker.consumer = FailingConsumer()  # type: ignore[assignment]
    worker._agents, worker._watermarks = {}, {}
    part = worker.partitions[TP] = worker.rebalance.held(*TP, 10, None)

    async def run() -> None:
        worker._loop = asyncio.get_running_loop()
        assert not part.accept(15, 0)
        await asyncio.sleep(0.05)  # the seek on the Kafka thread

    with caplog.at_level(logging.WARNING, logger="agents_stream.worker"):
        asyncio.run(run())
    worker._kafka.shutdown(wait=True)
    assert "seek back to 10 failed" in caplog.text
    worker.producer = NoReports()  # type: ignore[assignment]
    worker.intake.handle([])  # the batch ended
    assert part.accept(16, 0)  # fetched on from where it was: taken as real
    assert part._rewind is None
