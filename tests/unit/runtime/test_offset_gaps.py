"""The worker's offset gap check without a broker: which records of a partition being
fetched again are dropped, how a gap is told skipped from real, and that a failed seek
or a revoke cannot leave a partition stuck (the broker side: tests/integration)."""

from __future__ import annotations

import asyncio
import logging

from confluent_kafka import KafkaException, TopicPartition

from agents_stream import Agent, App, InputEvent, RunnerContext, action
from agents_stream.runtime.offsets import OffsetTracker
from agents_stream.runtime.worker import Worker

TP = ("in", 0)


class Echo(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event: InputEvent, ctx: RunnerContext) -> None:
        pass


class SeekingConsumer:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seeks: list[tuple[str, int, int]] = []

    def seek(self, tp: TopicPartition) -> None:
        if self.fail:
            raise KafkaException("partition not assigned")
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def make_worker(tmp_path, consumer: SeekingConsumer) -> Worker:
    app = App("unit-gaps")
    app.agent(Echo, input="in")
    worker = Worker(app, broker="127.0.0.1:1", data_dir=tmp_path)
    worker.consumer = consumer  # type: ignore[assignment]
    worker._owned.add(TP)
    return worker


def rewind(worker: Worker, expected: int, seen: int) -> None:
    """What _dispatch does on a gap, then the end of its consume batch."""

    async def run() -> None:
        worker._loop = asyncio.get_running_loop()
        worker._rewind(TP, expected, seen)
        await asyncio.sleep(0.05)  # the seek on the Kafka thread

    asyncio.run(run())


def test_records_fetched_before_the_seek_are_dropped_until_it_is_done(tmp_path) -> None:
    consumer = SeekingConsumer()
    worker = make_worker(tmp_path, consumer)
    rewind(worker, 10, 15)
    assert consumer.seeks == [("in", 0, 10)]
    assert not worker._rewound(TP, 16)  # same batch: fetched before the seek
    worker._rewinds[TP][2] = True  # the batch ended: the next consume is after the seek
    assert not worker._rewound(TP, 9)  # already started before the gap
    assert worker._rewound(TP, 10)  # the skipped records came back
    assert worker.stats["offset_gaps_recovered"] == 1
    assert TP not in worker._rewinds and TP not in worker._gaps_real


def test_a_gap_seen_again_is_real_and_not_checked_again_until_a_rebalance(tmp_path) -> None:
    worker = make_worker(tmp_path, SeekingConsumer())
    rewind(worker, 10, 15)
    worker._rewinds[TP][2] = True
    assert worker._rewound(TP, 15)  # nothing at 10-14: transaction markers, compaction
    assert worker._gaps_real[TP] == worker._rebalances
    assert worker.stats["offset_gaps_recovered"] == 0
    worker._rebalances += 1  # what the rebalance callbacks do
    assert worker._gaps_real[TP] != worker._rebalances  # checked again from now on


def test_a_failed_seek_lets_the_next_record_through(tmp_path, caplog) -> None:
    worker = make_worker(tmp_path, SeekingConsumer(fail=True))
    with caplog.at_level(logging.WARNING, logger="agents_stream.worker"):
        rewind(worker, 10, 15)
    assert "seek back to 10 failed" in caplog.text
    worker._rewinds[TP][2] = True
    assert worker._rewound(TP, 16)  # fetched on from where it was: taken as real
    assert TP not in worker._rewinds


def test_a_revoke_forgets_the_partition_s_rewind(tmp_path) -> None:
    worker = make_worker(tmp_path, SeekingConsumer())
    rewind(worker, 10, 15)
    # Built by run_async, which these tests do not start.
    worker._watermarks, worker._async_ios, worker.offsets = {}, {}, OffsetTracker()
    asyncio.run(worker.rebalance._forget({TP}, {}))
    assert TP not in worker._rewinds
