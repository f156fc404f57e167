"""The record path's first stage: consume a batch on the Kafka thread and hand each record
to its partition's bookkeeping and the controller, in its key's place in line.

From there the controller (controller.py) admits it, its partition's lane
(agent_host.py, durable/lane.py) runs its actions and journals them, and
``Partition.finish`` (partition.py) hands it to the group commit (worker_commits.py).
This stage also decides when fetching stops: it pauses the partitions when the in-flight
limit has had no room for a while, holds back one partition while the schema registry
refuses its records, and fetches a partition again from a gap the client skipped.

Everything here runs on the loop thread except the ``_kafka``-suffixed helpers, which
run on the worker's one Kafka thread (librdkafka consumers are not thread-safe).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, Message, TopicPartition

from ..durable.ownership import Ownership
from ..durable.runner import RecordInput
from ..errors import KafkaIOError
from ..host.progress import CompletedThrough
from ..kafka.admin import AUTHORIZATION_ERRORS, denied
from .async_io import AsyncIOHost
from .controller import ExecutionController
from .partition import Partition
from .timers import Firings

if TYPE_CHECKING:
    from ..app import App
    from .worker_rebalance import Rebalance

log = logging.getLogger("agents_stream.worker")

CONSUME_BATCH = 500  # records per consume call at most
PAUSE_AFTER = 1.0  # seconds without room before the partitions are paused
CONSUME_WAIT = 0.01  # seconds a consume waits for a batch to fill (idle: 100 calls/s)
SERVE_SATURATED = 1.0  # seconds between consumer polls while no record can be taken


class IntakeHost(Protocol):
    """What the intake reads of the worker (built in its ``_setup``, read when used)."""

    app: App
    consumer: Consumer
    controller: ExecutionController
    max_in_flight: int
    partitions: dict[tuple[str, int], Partition]
    firings: Firings
    progress: CompletedThrough | None
    ownership: Ownership
    stats: defaultdict[str, int]
    rebalance: Rebalance
    producer: Any  # JournalProducer: serve_due()
    _async_ios: dict[str, AsyncIOHost]
    _stopping: asyncio.Event | None
    _loop: asyncio.AbstractEventLoop | None
    _kafka: Any  # the Kafka thread's executor

    async def _on_kafka(self, fn: Any, *args: Any) -> Any: ...

    exit_code: int


class Intake:
    """Consumes for the worker ``w`` and dispatches what it consumed."""

    def __init__(self, w: IntakeHost) -> None:
        self._w = w
        self.paused = False  # every partition paused by the in-flight limit
        # Partitions a registry refusal holds back (host/registry_wait.py): kept paused
        # when the in-flight limit resumes the others.
        self._held_back: set[tuple[str, int]] = set()
        self._rewinding: list[Partition] = []  # partitions whose seek this batch issued
        self._last_poll = time.monotonic()
        # Bumped by the rebalance callbacks: offset gaps are checked again after one.
        self.generation = 0

    async def run(self) -> None:
        """Consume while the controller has room; pause the partitions only when it has
        had none for ``PAUSE_AFTER`` seconds.

        Why not pause at once: librdkafka drops a paused partition's prefetched records
        and fetches them again on resume. Draining a backlog fills the in-flight limit
        every few hundred milliseconds; pausing each time stalled the worker for the
        refetch (0.3-0.5 s on the embedded broker, every cycle). Short saturation keeps
        the prefetch (bounded by librdkafka's ``queued.max.messages.kbytes``); slow
        actions holding every slot for longer still stop the fetching. Below the low-water
        mark the loop waits for more room instead of consuming a few records per thread
        hop."""
        w = self._w
        assert w._stopping is not None
        controller = w.controller
        low_water = max(1, min(CONSUME_BATCH, w.max_in_flight // 8))
        saturated_since: float | None = None
        while not w._stopping.is_set():
            slots = controller.free_slots
            if slots < low_water and controller.in_flight > 0:
                now = time.monotonic()
                if saturated_since is None:
                    saturated_since = now
                elif not self.paused and now - saturated_since >= PAUSE_AFTER:
                    await w._on_kafka(self._pause_kafka, True)
                elif self.paused and now - self._last_poll >= SERVE_SATURATED:
                    # Paused partitions return no records; the poll serves rebalance
                    # callbacks (a revoke waits for them) and max.poll.interval.ms.
                    self.handle(await w._on_kafka(self.consume, 1))
                try:
                    await asyncio.wait_for(controller.wait_for_slots(low_water), 0.2)
                except TimeoutError:
                    pass
                continue
            saturated_since = None
            if self.paused:
                await w._on_kafka(self._pause_kafka, False)
            if slots == 0:  # records waiting for admission, none in flight: a moment
                await asyncio.sleep(0.01)
                continue
            self.handle(await w._on_kafka(self.consume, min(slots, CONSUME_BATCH)))

    def handle(self, msgs: list[Message]) -> None:
        """One consumed batch: records dispatched, client events acted on."""
        w = self._w
        serve_due = w.producer.serve_due
        for n, msg in enumerate(msgs):
            if n & 63 == 63:
                serve_due()  # hundreds of records dispatched: acks meanwhile
            err = msg.error()
            if err is None:
                self._dispatch(msg)
                continue
            code = err.code()
            if code == KafkaError._PARTITION_EOF:
                part = w.partitions.get((msg.topic(), msg.partition()))
                if part is not None and part.at_end(msg.offset(), self.generation):
                    w.firings.arm(part)
            elif code == KafkaError._MAX_POLL_EXCEEDED:
                # The consumer left the group: every partition may be another member's
                # already. Fenced now; the rebalance callbacks follow.
                w.ownership.suspend(f"max.poll.interval.ms exceeded ({err})")
                w.rebalance.suspected()
            elif code in AUTHORIZATION_ERRORS:
                self._denied(err)
            else:
                log.warning("consumer error: %s", err)
        if self._rewinding:
            # The seeks of this batch's rewinds run on the Kafka thread before the next
            # consume: what that returns for those partitions is fetched after them.
            for part in self._rewinding:
                part.seeks_issued()
            self._rewinding.clear()

    def _denied(self, err: KafkaError) -> None:
        """The group or an input refused by the cluster's authorizer: stop, in one line."""
        app = self._w.app
        self._w.exit_code = 1
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            line = denied(
                f"the consumer group {app.id} ({err.str()})", f"Read and Describe on group {app.id}"
            )
        else:
            topics = ", ".join(app.input_topics)
            line = denied(f"reading its inputs ({err.str()})", f"Read and Describe on {topics}")
        raise KafkaIOError(line, code=err.code())

    def _dispatch(self, msg: Message) -> None:
        """One record: to its partition's bookkeeping, then to the controller in its
        key's place in line (its lane runs it, see agent_host.py)."""
        w = self._w
        topic, number, offset = msg.topic(), msg.partition(), msg.offset()
        part = w.partitions.get((topic, number))
        if part is None or not part.accept(offset, self.generation):
            return  # fetched before a revoke (the new owner consumes it), or a rewind's
        if part.arm_at is not None and offset + 1 >= part.arm_at:
            w.firings.arm(part)
        progress = w.progress
        if progress is not None and progress.skips(topic, number, offset):
            # Finished before (re-consumed after an offset reset or a lost commit):
            # running it again would charge its side effects twice.
            part.skip(offset)
            w.stats["records_skipped_completed"] += 1
            return
        raw_key = msg.key()
        key = raw_key.decode("utf-8", "backslashreplace") if raw_key is not None else ""
        done = partial(part.finish, offset, key)
        host = part.host
        controller = w.controller
        if host is None:
            operator = w._async_ios[topic]
            controller.submit(
                ("aio", topic, number, offset), part.tp, lambda: operator.handle(msg), done
            )
            return
        # All agents of an app share memory per key, so they also share key order.
        # Keyless records share neither: each is its own "key" (InputEvent.key == "").
        order_key = key if raw_key is not None else ("", topic, number, offset)
        record = host.prepare(msg, key, number, offset, raw_key is None)
        if record is None:  # a skipped tombstone: finished as it is
            done(True)
        elif type(record) is RecordInput:
            # Run on the partition's lane: the records started together share one
            # journal append and ack wait per group of finished actions.
            controller.submit_to(part.lane, order_key, part.tp, record, done)
        else:  # undecodable: dead-lettered in key order
            dead_letter = partial(host.dead_letter, msg, "decode", cast(Exception, record))
            controller.submit(order_key, part.tp, dead_letter, done)
        watermarks = part.watermarks
        if watermarks is not None:
            ts_type, ts = msg.timestamp()
            if ts_type != TIMESTAMP_NOT_AVAILABLE:
                watermark = watermarks.on_record(number, ts)
                if watermark is not None:
                    controller.watermark(watermark, partial(w.firings.watermark_done, topic))

    def rewind(self, part: Partition, offset: int) -> None:
        """Loop thread: fetch ``part`` again from ``offset`` (see Partition.accept)."""
        self._rewinding.append(part)
        assert self._w._loop is not None
        self._w._loop.run_in_executor(self._w._kafka, self._seek_kafka, part.tp, offset)

    def _seek_kafka(self, tp: tuple[str, int], offset: int) -> None:
        """A failure (the partition was revoked meanwhile) leaves the gap to be taken as
        real by the next record."""
        try:
            self._w.consumer.seek(TopicPartition(tp[0], tp[1], offset))
        except Exception as exc:  # KafkaException; nothing to undo
            log.warning("%s[%d]: seek back to %d failed: %s", tp[0], tp[1], offset, exc)

    def consume(self, most: int) -> list[Message]:
        """Kafka thread: up to ``most`` records, waiting at most ``CONSUME_WAIT`` for the
        first one.

        consume(n, timeout) returns early only with a full batch, so one call with a
        timeout made a record arriving alone wait that timeout before it ran (10 ms,
        100 ms before that). What is there is taken at once; with nothing there, the
        wait ends at the first record, and whatever came with it is taken too."""
        w = self._w
        consumer = w.consumer
        self._last_poll = time.monotonic()
        w.rebalance.confirm_due(self._last_poll)  # released after a freeze: still ours?
        msgs: list[Message] = consumer.consume(most, 0)
        if msgs or most <= 1:
            return msgs or consumer.consume(1, CONSUME_WAIT)
        first: list[Message] = consumer.consume(1, CONSUME_WAIT)
        return first + consumer.consume(most - 1, 0) if first else first

    def _pause_kafka(self, pause: bool) -> None:
        consumer = self._w.consumer
        assignment = consumer.assignment()
        if pause:
            consumer.pause(assignment)
        else:
            held = self._held_back
            consumer.resume([tp for tp in assignment if (tp.topic, tp.partition) not in held])
        self.paused = pause

    def hold_back(self, topic: str, partition: int, pause: bool) -> None:
        """Loop thread: stop (or restart) fetching one partition while the schema
        registry refuses its records (host/registry_wait.py)."""
        if pause:
            self._held_back.add((topic, partition))
        else:
            self._held_back.discard((topic, partition))
        assert self._w._loop is not None
        self._w._loop.run_in_executor(
            self._w._kafka, self._pause_one_kafka, topic, partition, pause
        )

    def _pause_one_kafka(self, topic: str, partition: int, pause: bool) -> None:
        """Not held any more (revoked meanwhile): nothing to do."""
        if pause != ((topic, partition) in self._held_back):
            return  # undone before it ran
        try:
            if pause:
                self._w.consumer.pause([TopicPartition(topic, partition)])
            elif not self.paused:
                self._w.consumer.resume([TopicPartition(topic, partition)])
        except Exception as exc:  # KafkaException: not assigned any more
            log.debug("%s[%d]: pause=%s skipped: %s", topic, partition, pause, exc)
