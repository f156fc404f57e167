"""TimerService: when the live timers of the owned partitions are due.

The journal (ActionState topic) is the source of truth; this is the worker's in-memory
schedule of it, one event-time and one processing-time heap per (agent, partition):

1. On assign, a partition's live timers are loaded from its cache (``store.timers``),
   *held*: none fires until the partition is armed, i.e. the consumer re-consumed the
   input that was not committed before the takeover. A firing therefore never overtakes
   a record of its key that completed (partially) before a crash, which keeps the
   key-state versions of the runner meaningful.
2. Registrations are added once their ActionDone is acknowledged (runner hook).
3. ``due_event(agent, watermark)`` / ``due_processing(now)`` pop what is due on armed
   partitions; the host submits each as a firing in its key's place in line. Popped
   timers stay in the journal until their firing completes, so a firing that is
   abandoned (revoke, crash) is loaded again by the next owner.
4. On revoke, the partition's schedule is dropped; the timers stay in the topic.

Deleted timers are not removed from the heaps: a firing re-checks the journal and is a
no-op for a timer that is no longer live.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ..durable.journal import TimerEntry

if TYPE_CHECKING:
    from .agent_host import AgentHost
    from .controller import ExecutionController
    from .partition import Partition

log = logging.getLogger("agents_stream.worker")
NEVER = 1 << 62

_Slot = tuple[str, int]  # (agent, partition)


class TimerService:
    def __init__(self) -> None:
        self._heaps: dict[tuple[str, int, str], list[tuple[int, str]]] = {}
        self._scheduled: set[tuple[str, int, str, int, str]] = set()
        self._armed: set[_Slot] = set()
        self._loaded: set[_Slot] = set()

    def load(
        self, agent: str, partition: int, timers: Iterable[TimerEntry], *, armed: bool
    ) -> None:
        """Take over ``partition`` for ``agent`` with its journaled ``timers``."""
        self._loaded.add((agent, partition))
        if armed:
            self._armed.add((agent, partition))
        self.add(timers)

    def arm(self, agent: str, partition: int) -> bool:
        """Let the partition's timers fire; returns True if it was held."""
        slot = (agent, partition)
        if slot in self._armed or slot not in self._loaded:
            return False
        self._armed.add(slot)
        return True

    def armed(self, agent: str, partition: int) -> bool:
        return (agent, partition) in self._armed

    def add(self, timers: Iterable[TimerEntry]) -> None:
        """Schedule registered timers (duplicates of scheduled ones are ignored)."""
        for t in timers:
            if (t.agent, t.partition) not in self._loaded:
                continue  # not (or no longer) ours
            ident = (t.agent, t.partition, t.kind, t.ts, t.key)
            if ident in self._scheduled:
                continue
            self._scheduled.add(ident)
            heapq.heappush(
                self._heaps.setdefault((t.agent, t.partition, t.kind), []), (t.ts, t.key)
            )

    def drop(self, agent: str, partition: int) -> None:
        """Forget the partition (revoked): its timers stay in the journal."""
        slot = (agent, partition)
        self._loaded.discard(slot)
        self._armed.discard(slot)
        for kind in ("event", "processing"):
            self._heaps.pop((agent, partition, kind), None)
        self._scheduled = {s for s in self._scheduled if (s[0], s[1]) != slot}

    def due_event(self, agent: str, watermark: int) -> list[TimerEntry]:
        """Event-time timers of ``agent`` with ``ts <= watermark`` on armed partitions."""
        return self._pop(lambda a, kind: a == agent and kind == "event", watermark)

    def due_processing(self, now_ms: int) -> list[TimerEntry]:
        """Processing-time timers with ``ts <= now_ms`` on armed partitions."""
        return self._pop(lambda _a, kind: kind == "processing", now_ms)

    def pending(self) -> int:
        return len(self._scheduled)

    def held(self, agent: str, partition: int) -> int:
        """How many timers of the partition are scheduled."""
        return sum(len(self._heaps.get((agent, partition, k), ())) for k in ("event", "processing"))

    def _pop(self, select, limit: int) -> list[TimerEntry]:  # type: ignore[no-untyped-def]
        out: list[TimerEntry] = []
        for (agent, partition, kind), heap in self._heaps.items():
            if not select(agent, kind) or (agent, partition) not in self._armed:
                continue
            while heap and heap[0][0] <= limit:
                ts, key = heapq.heappop(heap)
                self._scheduled.discard((agent, partition, kind, ts, key))
                out.append(TimerEntry(key, kind, ts, agent, partition))
        out.sort(key=lambda t: t.ts)
        return out


def input_end(
    consumer: Consumer, topic: str, partition: int, *, earliest: bool = True
) -> tuple[int | None, int, int]:
    """Offset at which held timers of an input partition arm: its end offset when input
    remains to re-consume after the committed position, None when nothing does; and the
    offset where its first record is expected (-1: unknown): the group's committed
    offset, else, when the consumer starts a partition without one at its beginning
    (``earliest``: auto.offset.reset earliest), the partition's low watermark; and the
    group's committed offset (-1: none or unknown).

    Runs on the consumer's thread (rebalance callback). When the offsets cannot be read,
    only the partition EOF arms the timers.
    """
    tp = TopicPartition(topic, partition)
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=5.0, cached=False)
        [committed] = consumer.committed([TopicPartition(topic, partition)], timeout=5.0)
        if committed.error is not None:  # its offset (-1001) would read as "none"
            raise KafkaException(committed.error)
    except Exception as exc:
        log.warning("no end offset for %s[%d] (%s): timers wait for EOF", topic, partition, exc)
        return NEVER, -1, -1
    start = committed.offset if committed.offset >= 0 else low
    # Without a committed offset the first record was not checked for a gap, and on
    # Apache Kafka 4.1 librdkafka 2.12.1 (partition EOF on) skipped the first record of
    # a partition that was empty when assigned and kept through a cooperative rebalance
    # (tests/integration/test_worker.py::test_two_workers_share_partitions_and_failover):
    # the low watermark is where that record is expected.
    first = committed.offset if committed.offset >= 0 else (low if earliest else -1)
    return (high if start < high else None), first, committed.offset


TIMER_TICK = 0.05  # seconds between processing-time timer checks


class Firings:
    """The worker's side of its timers: loads a held partition's schedule, arms it once
    its uncommitted input was re-consumed, and submits what is due to the controller in
    its key's place in line (key order, in-flight limit, and a watermark's firings are
    part of its epoch). A firing never touches offsets: its timer's tombstone is its
    commit."""

    def __init__(
        self,
        service: TimerService,
        agents: Mapping[str, AgentHost],
        controller: ExecutionController,
        partitions: Mapping[tuple[str, int], Partition],
        stats: dict[str, int],
    ) -> None:
        self.service = service
        self._stats = stats
        self._agents = agents
        self._controller = controller
        self._partitions = partitions
        self.event_time: dict[str, int] = {}  # agent input topic -> its event time
        self._topics: dict[str, str] = {}  # agent name -> the input its timers fire for
        for topic, host in agents.items():
            if host.name in self._topics:
                log.warning(
                    "agent %s is bound to several inputs; its timers fire for %s only",
                    host.name,
                    self._topics[host.name],
                )
            else:
                self._topics[host.name] = topic

    def load(self, part: Partition, timers: list[TimerEntry]) -> None:
        """Loop thread, before any record of a newly assigned partition: its live timers,
        held until :meth:`arm` unless nothing is left to re-consume."""
        name = self._agents[part.topic].name
        self.service.load(name, part.number, timers, armed=part.arm_at is None)

    def arm(self, part: Partition) -> None:
        part.arm_at = None
        host = self._agents.get(part.topic)
        if host is not None and self.service.arm(host.name, part.number):
            held = self.service.held(host.name, part.number)
            if held:
                log.info(
                    "timers of %s[%d] armed: %d (uncommitted input re-consumed)",
                    part.topic, part.number, held,
                )  # fmt: skip

    def drop(self, topic: str, partition: int) -> None:
        """A revoke: no timer of the partition fires from now on (a firing after the
        drain would run again on the next owner)."""
        host = self._agents.get(topic)
        if host is not None:
            self.service.drop(host.name, partition)

    def watermark_done(self, topic: str, watermark: int) -> None:
        """Every record before this watermark has finished: event time has advanced, and
        the event-time timers of the topic's agent up to it fire."""
        self.event_time[topic] = watermark
        self._stats["watermarks"] += 1
        for timer in self.service.due_event(self._agents[topic].name, watermark):
            self._fire(topic, timer)

    async def run(self) -> None:
        """Processing-time timers, checked every ``TIMER_TICK``."""
        while True:
            await asyncio.sleep(TIMER_TICK)
            for timer in self.service.due_processing(int(time.time() * 1000)):
                topic = self._topics.get(timer.agent)
                if topic is not None:
                    self._fire(topic, timer)

    def _fire(self, topic: str, timer: TimerEntry) -> None:
        if (topic, timer.partition) not in self._partitions:
            return
        host = self._agents[topic]
        self._controller.submit(
            timer.key, (topic, timer.partition), lambda: host.handle_timer(timer), _ignore
        )


def _ignore(ok: bool) -> None:
    """A timer firing's end: nothing to commit (the timer tombstone is its commit)."""
