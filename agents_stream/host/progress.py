"""Completed-through markers: how every host says, durably, which input records are done.

An :class:`~agents_stream.durable.journal.InputProgress` marker in an input partition's
ActionState partition says "every record below this offset finished". Hosts write one
when they commit (the worker, at each group commit; the Faust host, when Faust has
committed) and only then prune (tombstone) the journals of the records below it: once a
record's journal is gone, the marker is what keeps it from running again if the group's
offsets are reset (guarantee 8). On assignment, records below the marker are skipped,
unless ``App(rerun_completed=True)``. Spark backfill reads the same marker to know where
the input is done.

This module is that protocol, written once; hosts decide *when* to call it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container, Sequence
from concurrent.futures import Future

from ..durable.journal import InputProgress
from ..durable.store import ActionStateStore

log = logging.getLogger("agents_stream.host")

Partition = tuple[str, int]


class CompletedThrough:
    """One host's completed-through markers: what it skips, what it writes next."""

    def __init__(self, store: ActionStateStore, writer: str, *, rerun_completed: bool) -> None:
        self.store = store
        self.writer = writer  # recorded in every marker (the worker id)
        self.rerun_completed = rerun_completed
        # Records below these offsets are done: skipped if the client hands them over.
        self.through: dict[Partition, int] = {}
        self._floor: dict[Partition, int] = {}  # markers never move back
        self._skip_logged: set[Partition] = set()
        # The highest marker known durable per partition (found on assignment, or
        # acked / committed since), rerun_completed or not: what two-phase commits wait
        # for (durable/twophase.py).
        self.durable: dict[Partition, int] = {}

    def load(self, topic: str, partition: int, *, prune: bool = False) -> int | None:
        """After the partition's cache rebuild: its marker's offset (None without one);
        records below it are skipped from now on, unless ``rerun_completed``. With
        ``prune`` (the host prunes committed records) the completion groups of records
        below it that a crash between a commit and its prune left are tombstoned."""
        tp = (topic, partition)
        self._skip_logged.discard(tp)
        marker = self.store.progress(topic, partition)
        self._floor[tp] = marker.offset if marker is not None else 0
        if marker is not None:
            self.durable[tp] = marker.offset
        else:
            self.durable.pop(tp, None)
        if marker is None:
            self.through.pop(tp, None)
            return None
        if self.rerun_completed:
            log.warning(
                "%s[%d]: rerun_completed: records below completed-through marker %d run "
                "AGAIN and charge their side effects once more",
                topic, partition, marker.offset,
            )  # fmt: skip
            self.through.pop(tp, None)
        else:
            self.through[tp] = marker.offset
            if prune:
                self.store.prune_below(topic, partition, marker.offset)
        return marker.offset

    def skips(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the record at ``offset`` is below the partition's marker (done); logs
        the first skip of each assignment."""
        through = self.through.get((topic, partition))
        if through is None or offset >= through:
            return False
        if (topic, partition) not in self._skip_logged:
            # A record the group already finished (re-consumed after an offset reset or
            # a lost commit): running it again would charge its side effects twice.
            self._skip_logged.add((topic, partition))
            log.warning(
                "%s[%d]: skipping %d records below completed-through marker %d",
                topic, partition, through - offset, through,
            )  # fmt: skip
        return True

    def markers(self, offsets: dict[Partition, int]) -> list[InputProgress]:
        """The markers of a commit of ``offsets`` (never below an earlier marker: offsets
        reset below it commit lower positions)."""
        now = int(time.time() * 1000)
        out = []
        for (topic, partition), position in offsets.items():
            position = max(position, self._floor.get((topic, partition), 0))
            self._floor[(topic, partition)] = position
            out.append(InputProgress(topic, partition, position, now, self.writer))
        return out

    def written(self, markers: Sequence[InputProgress], held: Container[Partition]) -> None:
        """``markers`` are durable (acked, or committed with their transaction): records
        below a marker this host wrote are done as below one it found on assignment, so
        if the client hands them over again (Apache Kafka did, after an asynchronous
        commit failed around a rebalance) they are skipped, not run again with their
        journal pruned."""
        for marker in markers:
            tp = (marker.topic, marker.partition)
            if tp in held:
                self.durable[tp] = max(self.durable.get(tp, 0), marker.offset)
        if self.rerun_completed:
            return
        for marker in markers:
            tp = (marker.topic, marker.partition)
            if tp in held:
                self.through[tp] = max(self.through.get(tp, 0), marker.offset)

    def committed(self, topic: str, partition: int, offset: int) -> None:
        """The group's committed offset of the partition is ``offset``: the records below
        it finished as surely as below a marker (a host commits only finished records;
        exactly-once, in the transaction), so it counts as durable completed-through for
        two-phase commits even before a marker says so (a host killed between its offset
        commit and its marker, with no record left to run, writes none for a while)."""
        if offset >= 0:
            tp = (topic, partition)
            self.durable[tp] = max(self.durable.get(tp, 0), offset)

    def durable_through(self, topic: str, partition: int) -> int | None:
        """The highest completed-through marker known durable, or None."""
        return self.durable.get((topic, partition))

    def forget(self, topic: str, partition: int) -> None:
        self.through.pop((topic, partition), None)
        self.durable.pop((topic, partition), None)
        self._skip_logged.discard((topic, partition))

    def write(self, markers: Sequence[InputProgress], timeout: float) -> bool:
        """Append ``markers`` and wait for their acks (blocking: not on the thread that
        serves the producer's reports unless it serves them while it waits); whether all
        were acked."""
        try:
            for marker in markers:
                self.store.append([marker], marker.partition).result(timeout=timeout)
        except Exception as exc:
            log.warning("completed-through marker not written (not pruning yet): %s", exc)
            return False
        return True

    def write_then_prune(
        self, topic: str, partition: int, position: int, done: list[tuple[int, str]]
    ) -> Future[None]:
        """Append the marker of ``position``; once it is acked, prune ``done`` (records
        ``(offset, key)`` below it). Not blocking (the Faust host's loop)."""
        (marker,) = self.markers({(topic, partition): position})
        store = self.store

        def prune(fut: Future[None]) -> None:
            if fut.exception() is not None:
                log.warning(
                    "completed-through marker not written (not pruning): %s", fut.exception()
                )
                return
            self.written([marker], {(topic, partition)})
            store.prune_records(done, partition, topic)

        appended = store.append([marker], partition)
        appended.add_done_callback(prune)
        return appended


class KeptJournals(set[tuple[int, int]]):
    """``(partition, offset)`` of finished records whose journal must outlive the commit
    that passes them: dead letters (their replay meets it) and replays (they run under
    an older seq). A set, so that ``if kept`` costs no call for the common empty case;
    every host that prunes asks :meth:`release` once per finished record."""

    def release(self, partition: int, offset: int) -> bool:
        """Whether the record's journal is kept (and forget it: asked once)."""
        record = (partition, offset)
        if record in self:
            self.discard(record)
            return True
        return False
