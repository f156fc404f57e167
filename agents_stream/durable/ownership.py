"""Ownership: which input partitions this member holds, checked before every write.

Why: a consumer group member can lose a partition without being told in time (its
session expired while it was frozen, ``max.poll.interval.ms`` was exceeded, a producer
was fenced). Another member then already runs that partition's records; anything this
one still does for them (a code block, a journal record, an output, an offset) is a
duplicate side effect or, worse, a journal slot written behind the new owner's back.
Kafka Streams fences such a "zombie" task first and cleans up after; so does this.

Each hold of an input partition gets a fresh *generation* (a positive integer). An action
takes its partition's generation as its *lease* when it starts; before each code block,
before its ActionDone and outputs, a cheap compare tells whether the hold is still the
one it started under. The Kafka side (journal store, output sink, commits) checks that
the partition is held at all. Release is immediate (one dict update), so a host fences a
partition in its rebalance callback *before* it abandons the in-flight work.

A frozen process (SIGSTOP, a VM pause, a swap storm) learns of its own loss only after
librdkafka heard from the coordinator, and every thread resumes at once. So a watchdog
calls :meth:`Ownership.beat` every few tens of milliseconds; a check that finds the last
beat older than ``freeze_after`` fails by itself, and the beat that notices the gap
suspends every hold (:attr:`suspended`) before it records the new time. Nothing is
produced between the resume and the rebalance callback; the host then asks the group
whether it still holds its partitions (see ``runtime/worker_rebalance.py``).

A worker cut off from the broker (a network partition) learns it the same way, from a
watch of its journal's acknowledgements (``runtime/connectivity.py``): a journal that
stopped answering sets :attr:`stalled`, and a code block about to start waits
(:meth:`admit`); a silence as long as the freeze limit suspends every hold.

The durable core imports nothing of Kafka: hosts that own no partitions (Spark backfill,
the test kit) pass no Ownership and nothing is checked.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from time import monotonic, sleep

from .errors import DurableError

STALL_POLL = 0.02  # seconds between looks of a code block waiting for the journal


class OwnershipLost(DurableError):
    """This member no longer (certainly) holds the partition: the work is abandoned, not
    failed. Never journaled, never dead-lettered; the partition's next owner replays it."""

    def __init__(self, topic: str, partition: int, why: str = "not held") -> None:
        self.topic = topic
        self.partition = partition
        where = f"{topic}[{partition}]" if topic else f"partition {partition}"
        super().__init__(f"{where}: {why}; abandoned for its next owner")


class Ownership:
    """Holds of input partitions, each with a generation; and a freeze watchdog's beat.

    ``freeze_after``: seconds without a beat after which every hold is suspect (None: no
    watchdog, nothing is ever suspected).
    """

    def __init__(self, freeze_after: float | None = None) -> None:
        self.freeze_after = freeze_after
        self._generations: dict[tuple[str, int], int] = {}
        # Journal partitions (an input partition's number) held through any input topic;
        # topic-less work (timer firings, journal writes) checks these.
        self._journal: dict[int, int] = {}
        self._next = itertools.count(1)
        self._lock = threading.Lock()  # acquire/release only; checks read without it
        self._beat = monotonic()
        self.suspended: str | None = None  # why every hold is suspect, until resumed
        self.suspensions = 0
        # The journal has writes outstanding and no answer for a while (set by the
        # host's connectivity watch): code blocks about to start wait (admit).
        self.stalled = False

    # -- holds (the host's rebalance callbacks) ----------------------------------------
    def acquire(self, topic: str, partition: int) -> int:
        """A new hold of ``topic[partition]``; returns its generation."""
        with self._lock:
            generation = next(self._next)
            if self._generations.get((topic, partition)) is None:  # else a new hold of it
                self._journal[partition] = self._journal.get(partition, 0) + 1
            self._generations[(topic, partition)] = generation
            return generation

    def release(self, topic: str, partition: int) -> bool:
        """Fence ``topic[partition]`` at once; False when it was not held."""
        with self._lock:
            if self._generations.pop((topic, partition), None) is None:
                return False
            left = self._journal.get(partition, 0) - 1
            if left > 0:
                self._journal[partition] = left
            else:
                self._journal.pop(partition, None)
            return True

    def held(self) -> list[tuple[str, int]]:
        return sorted(self._generations)

    # -- checks (any thread, lock-free) --------------------------------------------------
    def lease(self, topic: str, partition: int) -> int:
        """The current generation of ``topic[partition]`` (0: not held). A topic-less
        lease (timer firings) is the journal partition's hold count."""
        if topic:
            return self._generations.get((topic, partition), 0)
        return 1 if partition in self._journal else 0

    # Checked before every code block and journal write: the freeze test is inlined
    # rather than a method call of its own.
    def valid(self, topic: str, partition: int, lease: int) -> bool:
        """Whether work that started under ``lease`` may still write or run."""
        if self.suspended is not None or not lease:
            return False
        limit = self.freeze_after
        if limit is not None and monotonic() - self._beat > limit:
            return False
        if topic:
            return self._generations.get((topic, partition)) == lease
        return partition in self._journal

    def holds(self, partition: int) -> bool:
        """Whether journal partition ``partition`` (and its outputs) may be written."""
        if self.suspended is not None or partition not in self._journal:
            return False
        limit = self.freeze_after
        return limit is None or monotonic() - self._beat <= limit

    def check(self, topic: str, partition: int, lease: int) -> None:
        if not self.valid(topic, partition, lease):
            raise OwnershipLost(topic, partition, self.suspended or "no longer held")

    def admit(self, topic: str, partition: int, lease: int) -> None:
        """Before a code block starts: while the journal is :attr:`stalled`, wait (on a
        plain thread: a code block on the event loop's thread cannot block, the loop
        serves the acks; coroutine code blocks wait in :meth:`admit_async`), until it
        answers again or the hold fails; then :meth:`check`.

        Why wait rather than fail: a stall is most often a slow broker; a call started
        now could not be journaled until it answers, and a crash or a cut meanwhile
        runs it again on the next owner."""
        if self.stalled and asyncio._get_running_loop() is None:
            while self.stalled and self.valid(topic, partition, lease):
                sleep(STALL_POLL)
        if not self.valid(topic, partition, lease):  # check(), inlined: once per call
            raise OwnershipLost(topic, partition, self.suspended or "no longer held")

    async def admit_async(self, topic: str, partition: int, lease: int) -> None:
        """:meth:`admit` for a coroutine code block, which starts on the event loop's
        thread: it waits by yielding to the loop (which goes on serving the acks that end
        the stall) instead of blocking it."""
        while self.stalled and self.valid(topic, partition, lease):
            await asyncio.sleep(STALL_POLL)
        self.check(topic, partition, lease)

    def check_partition(self, partition: int, what: str = "") -> None:
        if self.suspended is None and partition in self._journal:
            limit = self.freeze_after
            if limit is None or monotonic() - self._beat <= limit:
                return
        why = self.suspended or "no longer held"
        raise OwnershipLost("", partition, f"{why} ({what} refused)" if what else why)

    # -- freeze watchdog -----------------------------------------------------------------
    def beat(self) -> float:
        """Called every few tens of ms by a watchdog thread. Returns the gap since the
        previous beat; a gap over ``freeze_after`` suspends every hold *before* the new
        beat is recorded, so no thread can pass a check in between."""
        now = monotonic()
        gap = now - self._beat
        limit = self.freeze_after
        if limit is not None and gap > limit and self.suspended is None:
            self.suspend(f"this process was frozen for {gap:.1f}s (over {limit:.1f}s)")
        self._beat = now
        return gap

    def suspend(self, why: str) -> None:
        """Every hold is suspect until :meth:`resume` (the group confirmed them)."""
        self.suspensions += 1
        self.suspended = why

    def resume(self) -> None:
        self._beat = monotonic()
        self.suspended = None
