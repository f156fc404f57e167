"""Rebuild-on-assign, revoke and lost partitions (:class:`Rebalance`, a part of
:class:`~agents_stream.runtime.worker.Worker`); these run on the kafka thread, inside the
consumer's rebalance callbacks.

Rebalance protocol (on revoke): stop taking records of the revoked partitions and firing
their timers, drain their in-flight records and firings up to ``shutdown_timeout``
(abandon the rest: they were not committed, and replay from the journal on the next
owner), commit, forget their bookkeeping, prune, close their caches. A revoke is
cooperative: the group waits for it, nobody else owns the partitions meanwhile.

On lost (the session expired, the consumer left the group after
``max.poll.interval.ms``, or this process was frozen long enough for either: see
``durable/ownership.py``), another member may run the partitions already. Fence first,
then clean up, as Kafka Streams does for a zombie task: the holds are released before
anything else (from then on no code block starts, no journal record, output, offset or
completed-through marker is written for them), the in-flight work is cancelled at once,
not drained, and nothing is committed.

After a freeze the consumer may still hold its partitions (the session outlived it), or
may learn only later that it does not. Every hold is released as if lost; once a
heartbeat had time to come back, a synchronous commit of the partitions' committed
offsets asks the coordinator (it refuses a member of an old generation): confirmed
partitions are taken again from their committed offsets (their cache rebuilt, their
uncommitted records run again with calls replayed), the others wait for the group's
callbacks.
On assign: catch up each partition's RocksDB cache from the ActionState topic before any
record of it is processed.
With the cooperative-sticky assignor (the default) the callbacks receive only the
partitions added or taken away; the others keep running meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from ..durable.ownership import Ownership
from ..errors import KafkaIOError
from ..kafka.transactions import TransactionalProducer, TransactionFailed
from ..state.recovery import RebuildCancelled
from .partition import Partition
from .timers import input_end

if TYPE_CHECKING:
    from ..app import App
    from ..durable.twophase import Settler
    from ..host.progress import CompletedThrough
    from ..state.kafka import KafkaActionStateStore
    from .agent_host import AgentHost
    from .async_io import AsyncIOHost
    from .commit import GroupCommit
    from .controller import ExecutionController
    from .intake import Intake
    from .timers import Firings
    from .watermarks import WatermarkGenerator
    from .worker_commits import Commits, Snapshot

log = logging.getLogger("agents_stream.worker")

# Recovering the transactional producer after an abort (after_freeze): retried with a
# backoff up to this many seconds while the failure is a broker's, given up (the worker
# stops, exit code 1, for its supervisor to restart) after this many calls in a row that
# blocked past the worker's own deadline (kafka/deadline.py): each leaves a thread stuck.
RECOVERY_BACKOFF_MAX = 10.0
MAX_BLOCKED_IN_A_ROW = 3


class RebalanceHost(Protocol):
    """What the partition lifecycle reads and updates of the worker."""

    app: App
    store: KafkaActionStateStore | None
    controller: ExecutionController
    firings: Firings
    stats: defaultdict[str, int]
    rebuilding: int
    partitions: dict[tuple[str, int], Partition]
    _agents: dict[str, AgentHost]
    _async_ios: dict[str, AsyncIOHost]
    _watermarks: dict[str, WatermarkGenerator]
    intake: Intake
    _reset_earliest: bool
    progress: CompletedThrough | None
    settler: Settler | None
    committer: GroupCommit
    _loop: asyncio.AbstractEventLoop | None
    ownership: Ownership
    consumer: Consumer
    transactions: TransactionalProducer | None
    _heartbeat_s: float
    shutdown_timeout: float
    _kafka: Any

    commits: Commits
    fatal: BaseException | None

    def _fail(self, exc: BaseException) -> None: ...


class Rebalance:
    """Partition lifecycle, for the worker ``w``: reads and updates its bookkeeping
    (:class:`RebalanceHost`); the commit steps are the worker's :class:`Commits`."""

    def __init__(self, w: RebalanceHost) -> None:
        self._w = w
        self._recoveries = 0  # failed recoveries of the transactional producer in a row
        self.state_refs: defaultdict[int, int] = defaultdict(int)  # journal partition use
        # Partitions released after a freeze that the consumer may still hold: taken
        # again once a commit confirms the group membership (:meth:`confirm`), tried
        # from ``_verify_at`` on.
        self.unconfirmed: set[tuple[str, int]] = set()
        self._verify_at = 0.0

    def subscribe(self, consumer: Consumer, topics: list[str]) -> None:
        consumer.subscribe(
            topics, on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost
        )

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Incremental (cooperative-sticky): ``partitions`` are only the ones added; the
        partitions already owned keep running meanwhile. Under an eager assignor it is
        the whole assignment, after a revoke of the whole previous one."""
        self._w.intake.generation += 1  # offset gaps are checked again (intake.py)
        if not partitions:
            return  # a cooperative rebalance that added nothing here
        started = time.monotonic()
        replayed = 0
        self._w.rebuilding = len(partitions)
        if self._w.store is not None:
            # Said before the rebuild, which can take a while (issue 54: what it waits for).
            log.info(
                "joined group %s: taking %s; rebuilding their journal cache from %s",
                self._w.app.id,
                _fmt(partitions),
                self._w.app.action_state_topic,
            )
        if self._w.store is not None:  # all new journal partitions caught up in one pass
            fresh = {
                tp.partition
                for tp in partitions
                if tp.topic in self._w._agents and self.state_refs[tp.partition] == 0
            }
            try:
                replayed = self._w.store.assign(*sorted(fresh)) if fresh else 0
            except RebuildCancelled as exc:
                # Stopping: none of them becomes owned, so their records are ignored and
                # nothing is committed for them; the next owner rebuilds from the
                # checkpoints this rebuild reached.
                self._w.rebuilding = 0
                log.info("not taking %s: %s", _fmt(partitions), exc)
                return
        for tp in partitions:
            through = None
            if tp.topic in self._w._agents and self._w.store is not None:
                if self.state_refs[tp.partition] == 0:
                    replayed += self._w.store.assign(tp.partition)
                self.state_refs[tp.partition] += 1
                through = self._load_progress(tp.topic, tp.partition)
                name = self._w._agents[tp.topic].name
                timers = [t for t in self._w.store.timers(tp.partition) if t.agent == name]
                arm_at, first, committed = input_end(
                    consumer, tp.topic, tp.partition, earliest=self._w._reset_earliest
                )
                if self._w.progress is not None:
                    self._w.progress.committed(tp.topic, tp.partition, committed)
                part = self.held(tp.topic, tp.partition, first, arm_at, committed)
                assert self._w._loop is not None
                # Runs on the loop before any record fetched by this consume call.
                self._w._loop.call_soon_threadsafe(self._w.firings.load, part, timers)
            else:
                part = self.held(tp.topic, tp.partition, -1, None)
            self._w.partitions[(tp.topic, tp.partition)] = part
            self._w.ownership.acquire(tp.topic, tp.partition)
            settler = self._w.settler
            if settler is not None and tp.topic in self._w._agents:
                # Held now: the last owner's two-phase calls below the marker are
                # committed or aborted (durable/twophase.py), off this thread.
                settler.assigned(tp.topic, tp.partition)
            if through is not None and self._w.app.prune_completed and self._w.store is not None:
                # Held now: what a crash between a commit and its prune left of
                # completion groups below the marker is tombstoned.
                self._w.store.prune_below(tp.topic, tp.partition, through)
        if self._w.intake.paused:
            consumer.pause(partitions)
        self._w.rebuilding = 0
        self._w.stats["journal_records_replayed"] += replayed
        log.info(
            "assigned %s (replayed %d journal records in %.2fs); ready: processing them",
            _fmt(partitions),
            replayed,
            time.monotonic() - started,
        )

    def held(
        self, topic: str, number: int, first_expected: int, arm_at: int | None, committed: int = -1
    ) -> Partition:
        """The bookkeeping of a partition just taken, before any of its records is
        dispatched."""
        return Partition(
            topic,
            number,
            committed=committed,
            host=self._w._agents.get(topic),
            watermarks=self._w._watermarks.get(topic),
            first_expected=first_expected,
            arm_at=arm_at,
            seek=self._w.intake.rewind,
            stats=self._w.stats,
        )

    def _load_progress(self, topic: str, partition: int) -> int | None:
        """Kafka thread, after the cache rebuild: the partition's completed-through marker
        (records below it are skipped, see ``host/progress.py``)."""
        assert self._w.progress is not None
        return self._w.progress.load(topic, partition)

    def on_revoke(
        self, consumer: Consumer, partitions: list[TopicPartition], *, lost: bool = False
    ) -> None:
        """Incremental (cooperative-sticky): only the partitions taken away; the others
        keep running. ``lost``: see :meth:`_on_lost`."""
        self._w.intake.generation += 1  # offset gaps are checked again (intake.py)
        revoked = {(tp.topic, tp.partition) for tp in partitions} & self._w.partitions.keys()
        self.unconfirmed -= {(tp.topic, tp.partition) for tp in partitions}
        if not revoked:
            return
        if lost:  # fence first: from here on nothing of them runs or is written
            for topic, partition in revoked:
                self._w.ownership.release(topic, partition)
        assert self._w._loop is not None
        # This thread is blocked in the callback, so the loop side cannot call back into
        # it: the loop quiesces and snapshots, this thread commits, the loop forgets.
        abandoned, offsets = asyncio.run_coroutine_threadsafe(
            self._quiesce(revoked, 0.0 if lost else self._w.shutdown_timeout), self._w._loop
        ).result()
        committed: dict[tuple[str, int], int] = {}
        marked = True
        if not lost and (offsets or self._w.committer.pending):
            # Synchronous; with exactly-once the open transaction, holding finished
            # records of every partition, commits now with the revoked ones' offsets.
            try:
                marked, committed = self._w.commits.group_commit(offsets, False)
            except TransactionFailed as exc:
                self.lose_everything(str(exc))
            except KafkaIOError as exc:
                log.warning("commit on revoke failed: %s", exc)
        done = asyncio.run_coroutine_threadsafe(
            self._forget(revoked, committed), self._w._loop
        ).result()
        if marked and not lost:
            self._w.commits.prune(done)
        for topic, partition in revoked:
            self._w.ownership.release(topic, partition)  # after the commit's own writes
            self._w.partitions.pop((topic, partition), None)
            if topic in self._w._agents and self._w.store is not None:
                self.state_refs[partition] -= 1
                if self.state_refs[partition] <= 0:
                    self.state_refs.pop(partition, None)
                    if self._w.settler is not None:
                        self._w.settler.revoked(partition)
                    self._w.store.revoke(partition)
        log.info(
            "%s %s (%d in-flight records abandoned)",
            "lost" if lost else "revoked",
            _fmt(partitions),
            abandoned,
        )

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions taken without a revoke (this member's session expired, e.g. after
        a stall): another member may own them already, so they are fenced at once and
        their in-flight work abandoned, not drained; neither offsets nor
        completed-through markers are written for them; their uncommitted records run
        again on the new owner, calls replayed from the journal."""
        log.warning("lost %s without a revoke (session expired?)", _fmt(partitions))
        if self._w.transactions is not None:
            # The open transaction holds their finished records' outputs, which their
            # next owner sends again: it must abort, and with it what it holds of the
            # other partitions, which are therefore taken again too.
            self.lose_everything(f"lost {_fmt(partitions)}")
        self.on_revoke(consumer, partitions, lost=True)

    def lose_everything(self, why: str) -> None:
        """Kafka thread (exactly-once): suspend every hold now; the loop then releases
        them all, aborts the transaction and asks the group (:meth:`_after_freeze`)."""
        if self._w.ownership.suspended is None:
            self._w.ownership.suspend(f"{why}: the open transaction is aborted")
        assert self._w._loop is not None
        self._w._loop.call_soon_threadsafe(self.suspected)

    def suspected(self) -> None:
        """Loop thread: every hold is suspect (a freeze, the consumer left the group, a
        write was not taken). Nothing of them runs or is written meanwhile (the checks
        fail); the Kafka thread releases them and asks the group."""
        why = self._w.ownership.suspended
        if why is None:
            return
        self._w.stats["ownership_suspensions"] += 1
        log.warning("%s: every partition is treated as lost until the group confirms", why)
        assert self._w._loop is not None
        self._w._loop.run_in_executor(self._w._kafka, self.after_freeze)

    def undelivered(self, exc: BaseException) -> None:
        """Loop thread: a record's journal or output write was not taken by the cluster
        (timed out in the client after its retries, fenced): the writes after it on that
        partition may be missing too, so every hold is given up and taken again from the
        committed offsets once the group confirms, as after a broker silence
        (connectivity.py). Said once per episode, not per record."""
        self._w.stats["records_undelivered"] += 1
        if getattr(exc, "code", None) == KafkaError._FATAL and self._w.transactions is None:
            # The journal producer is unusable for good (an idempotence failure): taking
            # the partitions again would fail the same way. A restart gets a new one.
            if self._w.fatal is None:
                log.critical("journal producer unusable, stopping: %s", exc)
                self._w._fail(exc)
            return
        if self._w.ownership.suspended is None:
            self._w.ownership.suspend(f"a write to Kafka failed ({exc})")
            self.suspected()

    def after_freeze(self) -> None:
        """Kafka thread, once the holds were suspended (see the module doc): release
        every partition as lost, then let :meth:`_confirm` ask the group."""
        held = [TopicPartition(t, p) for t, p in sorted(self._w.partitions)]
        if held:
            self.on_revoke(self._w.consumer, held, lost=True)
        self.unconfirmed |= {(tp.topic, tp.partition) for tp in held}
        transactions = self._w.transactions
        if transactions is not None:
            # Nothing of the abandoned records may commit (their next run sends them).
            try:
                transactions.abort()
            except Exception as exc:
                if not self._recoverable(exc):
                    log.critical("transactional producer unusable, stopping: %s", exc)
                    assert self._w._loop is not None
                    self._w._loop.call_soon_threadsafe(self._w._fail, exc)
                    return
                # A broker outage, a coordinator moving: nothing is held meanwhile (the
                # holds stay suspended), so nothing runs, and the recovery is tried again.
                self._recoveries += 1
                backoff = min(RECOVERY_BACKOFF_MAX, 0.5 * 2**self._recoveries)
                log.warning(
                    "transactional producer not recovered yet (%s): retrying in %.1fs", exc, backoff
                )
                self._retry_after_freeze(backoff)
                return
            self._recoveries = 0
        # librdkafka heartbeats on its own thread: after one interval (and a margin) it
        # has heard whether the session survived, and delivers the loss on the next poll.
        self._verify_at = time.monotonic() + self._w._heartbeat_s + 0.5
        self._w.ownership.resume()  # nothing is held now; new assignments are real

    def _recoverable(self, exc: BaseException) -> bool:
        """Whether a failed recovery of the transactional producer is worth another try:
        a broker error is, unless the cluster's authorizer refused it (no retry fixes an
        ACL) or calls keep blocking past the worker's deadline (a client that does not
        come back: a restart of the process does)."""
        transactions = self._w.transactions
        if not isinstance(exc, TransactionFailed) or exc.denied:
            return False
        return transactions is None or transactions.deadline.in_a_row < MAX_BLOCKED_IN_A_ROW

    def _retry_after_freeze(self, delay: float) -> None:
        loop = self._w._loop
        assert loop is not None

        def again() -> None:
            loop.run_in_executor(self._w._kafka, self.after_freeze)

        loop.call_soon_threadsafe(loop.call_later, delay, again)

    def confirm_due(self, now: float) -> None:
        """Kafka thread, before a consume: confirm released partitions when it is time."""
        if self.unconfirmed and now >= self._verify_at:
            self.confirm()

    def confirm(self) -> None:
        """Kafka thread: take back the partitions released after a freeze that the group
        still gives this member. The coordinator accepts a commit only from a member of
        the current generation, so one synchronous commit of their committed offsets (a
        no-op for the group) is the confirmation."""
        assignment = {(tp.topic, tp.partition) for tp in self._w.consumer.assignment()}
        self.unconfirmed &= assignment
        if not self.unconfirmed:
            return
        journal = getattr(self._w, "producer", None)
        if journal is not None and journal._producer is not None and len(journal._producer):
            # Writes of the abandoned work still outstanding (a broker that stopped
            # answering: runtime/connectivity.py): the cache rebuilt now could miss one
            # that lands later, and its call would run again. Taken once they are in.
            self._verify_at = time.monotonic() + 0.2
            return
        tps = [TopicPartition(t, p) for t, p in sorted(self.unconfirmed)]
        try:
            committed = self._w.consumer.committed(tps, timeout=self._w.shutdown_timeout)
            unknown = [tp for tp in committed if tp.error is not None]
            if unknown:
                # A partition's own error (a coordinator loading, offsets of a
                # transaction still pending: UNSTABLE_OFFSET_COMMIT) comes back as
                # offset -1001, which is also "never committed": taken for that, the
                # partition would be fetched again from its start.
                raise KafkaIOError(
                    "; ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in unknown)
                )
            known = [tp for tp in committed if tp.offset >= 0]
            if known:
                self._w.consumer.commit(offsets=known, asynchronous=False)
        except Exception as exc:  # a stale generation, a rebalance under way: not yet
            log.info("group did not confirm %s yet: %s", _fmt(tps), exc)
            self._verify_at = time.monotonic() + 1.0
            return
        self.unconfirmed.clear()
        for tp in committed:  # fetched again from the committed offset (or the start)
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            try:
                self._w.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            except Exception as exc:
                log.warning("%s[%d]: seek to %d failed: %s", tp.topic, tp.partition, offset, exc)
        log.info("group confirmed %s after the freeze: taking them again", _fmt(tps))
        self.on_assign(self._w.consumer, tps)

    async def _quiesce(self, revoked: set[tuple[str, int]], timeout: float) -> tuple[int, Snapshot]:
        """Loop side of a revoke, before the commit: no timer of ``revoked`` fires from
        now on (a firing after the drain would run again on the next owner), then
        their in-flight work is drained for up to ``timeout`` (0: cancelled at once).
        Returns the abandoned count and the offsets to commit."""
        for topic, partition in revoked:
            self._w.firings.drop(topic, partition)
        abandoned = await self._w.controller.drain(revoked, timeout)
        return abandoned, self._w.commits.committable(revoked)

    async def _forget(
        self, revoked: set[tuple[str, int]], committed: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], list[tuple[int, str]]]:
        """Loop side of a revoke, after the commit: drop the partitions' bookkeeping;
        returns the finished records the commit covers (to prune)."""
        done = self._w.commits.committed(committed)
        for topic, partition in revoked:
            if topic in self._w._watermarks:
                self._w._watermarks[topic].forget(partition)
            host = self._w._async_ios.get(topic)
            if host is not None:  # a revoked partition must not hold back the watermark
                host.forget_partitions([partition])
        return done


def _fmt(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
