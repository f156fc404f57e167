"""Partition: what the worker knows of one input partition it holds.

One object per assignment, made on the Kafka thread when the partition is assigned (its
cache rebuilt) and dropped when it is revoked or lost; a partition assigned again gets a
new one. Everything that used to live in separate dictionaries keyed by partition is
here: which offsets started and finished (the commit's position), the finished records
the next commit covers (pruned after it), the offset-gap check, where its first record is
expected, when its held timers arm, and the agent, lane and watermarks its records are
dispatched with.

Threads: the loop reads and updates it (dispatch, finishing records, commit snapshots);
the Kafka thread only creates it, before any of its records is handed to the loop, and
drops it. The loop's bookkeeping is therefore never shared with a thread that mutates it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from .logs import record_fields
from .offsets import PartitionOffsets

if TYPE_CHECKING:
    from .agent_host import AgentHost, PartitionLane
    from .watermarks import WatermarkGenerator

log = logging.getLogger("agents_stream.worker")

Seek = Callable[["Partition", int], None]


class Partition:
    """One held input partition, from its assignment to its revoke.

    Args:
        topic, number: the partition.
        host: its agent (None for an Async I/O input).
        watermarks: its topic's watermark generator, where event time is used.
        first_expected: the group's committed offset (or the low watermark when none is
            and the consumer starts there): where its first record is expected; -1 when
            unknown.
        arm_at: the input end offset seen at assign: its held timers arm once the
            consumer reached it (None: armed already).
        seek: fetches a partition again from an offset (on the Kafka thread).
        stats: the worker's counters.
    """

    __slots__ = (
        "_gaps_real",
        "_lane",
        "_rewind",
        "_seek",
        "_stats",
        "arm_at",
        "committed_at_assign",
        "finished",
        "first_expected",
        "host",
        "kept",
        "number",
        "offsets",
        "topic",
        "tp",
        "watermarks",
    )

    def __init__(
        self,
        topic: str,
        number: int,
        *,
        host: AgentHost | None,
        watermarks: WatermarkGenerator | None,
        first_expected: int,
        arm_at: int | None,
        seek: Seek,
        stats: defaultdict[str, int],
        committed: int = -1,
    ) -> None:
        self.topic = topic
        self.number = number
        self.tp = (topic, number)
        self.host = host
        self.kept = host.kept if host is not None else None
        self.watermarks = watermarks
        self.offsets = PartitionOffsets()
        # Finished records the next commit may cover, a heap by offset (pruned after it).
        self.finished: list[tuple[int, str]] = []
        self.first_expected = first_expected
        self.arm_at = arm_at
        # The group's committed offset when it was assigned (-1: none or unknown): what
        # the committed-offset gauge shows before this worker commits anything.
        self.committed_at_assign = committed
        self._lane: PartitionLane | None = None
        # An offset gap being checked (see accept): [expected offset, offset seen past it,
        # armed (its seek was issued), the rebalance generation it was found in]; and the
        # generation in which a gap of this partition was found real (compaction,
        # transaction markers): not checked again until the next rebalance.
        self._rewind: list[int] | None = None
        self._gaps_real = -1
        self._seek = seek
        self._stats = stats

    @property
    def lane(self) -> PartitionLane:
        """Where its agent's records run (a new one once a drain stopped the previous)."""
        lane = self._lane
        if lane is None or lane.stopped:
            assert self.host is not None, "an Async I/O input has no lane"
            lane = self._lane = self.host.lane(self.number)
        return lane

    # -- dispatch ---------------------------------------------------------------------
    def accept(self, offset: int, generation: int) -> bool:
        """Whether the record at ``offset`` is processed; if so it is started (the commit
        stays below it until :meth:`finish`).

        A record whose offset skips past the previous one's + 1 (or, first after the
        assignment, past where its first record was expected) may follow records the
        client never handed over, which the commit would pass: the partition is fetched
        again from the first missing offset once (:meth:`_rewind_to`); the records
        fetched before that seek are dropped. ``generation`` counts the group's
        rebalances: a gap found real is not checked again until the next one."""
        rewind = self._rewind
        if rewind is not None and not self._rewound(rewind, offset):
            return False
        tracker = self.offsets
        expected = tracker.next
        if expected < 0:
            expected, self.first_expected = self.first_expected, -1
        # expected 0: the first record of a partition without a committed offset, due
        # at offset 0 (its low watermark, see timers.input_end); -1: unknown.
        if offset > expected >= 0:
            # Offsets skipped since the last record of this partition (or its committed
            # offset): compaction or transaction markers in the input, or records the
            # client never handed over, which the commit would pass (see
            # docs/operations.md, offset gaps).
            if self._gaps_real != generation:
                if tracker.next < 0:  # checked again once fetched from there
                    self.first_expected = expected
                self._rewind_to(expected, offset, generation)
                return False
            self._stats["offset_gaps"] += 1
        tracker.start(offset)
        return True

    def finish(self, offset: int, key: str, ok: bool) -> None:
        """A record's end (``ok``: finished; else it stays unfinished and holds the
        commit back, as the error policy stopped the worker)."""
        if ok:
            self.offsets.finish(offset)
            kept = self.kept
            # A dead letter's journal is kept for its replay (host/dlq.py).
            if not (kept and kept.release(self.number, offset)):
                heappush(self.finished, (offset, key))
            self._stats["records"] += 1

    def skip(self, offset: int) -> None:
        """A started record that is not run (finished before, see host/progress.py)."""
        self.offsets.finish(offset)

    def seeks_issued(self) -> None:
        """The loop handed a batch over: its rewind's seek runs on the Kafka thread
        before the next consume, so what that returns is fetched after the seek."""
        if self._rewind is not None:
            self._rewind[2] = 1

    def at_end(self, end: int, generation: int) -> bool:
        """A partition EOF at ``end``: whether it is really caught up there.

        Its end is also checked for a gap, since no later record may reveal one: on
        Apache Kafka 4.1 librdkafka 2.12.1 skipped the only record of a partition that
        was empty when assigned and kept through a cooperative rebalance (the worker saw
        just the EOF after it). A partition being fetched again is not at its end until
        the fetch reaches ``end`` with nothing before it (offsets without records, e.g.
        a transaction marker: the gap is real)."""
        rewind = self._rewind
        if rewind is not None:
            expected, seen, armed, found = rewind
            if not armed or end < seen:
                return False
            self._rewind = None
            self._gaps_real = found
            return True
        expected = self.offsets.next
        if expected < 0:
            expected = self.first_expected
        if end > expected >= 0 and self._gaps_real != generation:
            self._rewind_to(expected, end, generation)
            return False
        return True

    def _rewind_to(self, expected: int, seen: int, generation: int) -> None:
        """Fetch again from ``expected``: a record at ``seen`` came after a gap.

        Why: on a Kafka-protocol broker tested here, librdkafka handed a kept partition's
        records over with a hole at a cooperative rebalance (partition EOF on, a short
        fetch wait); the commit would then pass the missing records, lost. One seek back
        tells a skipped record (it comes back) from an offset that holds none (compaction,
        transaction markers: the same gap again). A partition whose gap was real is not
        checked again until the next rebalance, so a compacted or transactional input
        pays one seek per partition per rebalance. A gap found real is so for the
        generation the check began in: a rebalance while the partition is fetched again
        may bring a hole of its own, which is checked again (tests/unit/runtime/
        test_partition_model.py found one slipping through when the verdict was recorded
        for the generation it ended in)."""
        self._rewind = [expected, seen, 0, generation]
        self._seek(self, expected)

    def _rewound(self, rewind: list[int], offset: int) -> bool:
        """Whether a record at ``offset`` is processed while a rewind is under way: the
        records fetched before its seek are dropped."""
        expected, seen, armed, found = rewind
        if not armed or offset < expected:
            return False
        self._rewind = None
        if offset < seen:
            self._stats["offset_gaps_recovered"] += 1
            log.warning(
                "%s[%d]: the client skipped offsets %d-%d (fetched again; they would "
                "have been committed past)",
                self.topic, self.number, expected, seen - 1,
                extra=record_fields(self.topic, self.number, offset, None),
            )  # fmt: skip
        else:  # nothing there: counted as a gap by accept, not checked again
            self._gaps_real = found
        return True

    # -- commit -----------------------------------------------------------------------
    def committed(self, position: int) -> list[tuple[int, str]]:
        """A commit of ``position`` landed: the finished records it covers (to prune)."""
        tracker = self.offsets
        tracker.committed = max(tracker.committed, position)
        finished = self.finished
        covered: list[tuple[int, str]] = []
        # A heap by offset: a commit takes what it covers without walking the records
        # finished past it (thousands while a slow key holds it back).
        while finished and finished[0][0] < position:
            covered.append(heappop(finished))
        return covered

    def uncommit(self, offset: int) -> None:
        """A commit of ``offset`` failed: committable again at the next commit."""
        tracker = self.offsets
        tracker.committed = min(tracker.committed, offset - 1)
