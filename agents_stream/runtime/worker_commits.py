"""The worker's commit protocol (a mixin of :class:`~agents_stream.runtime.worker.Worker`).

Commit protocol (every ``commit_interval`` and on revoke/shutdown):
  1. per partition, the committable offset is the lowest offset whose record is not
     finished (a record finishes when all its actions completed and their outputs and
     journal records were acknowledged);
  2. commit those offsets: asynchronously every ``commit_interval`` (a synchronous
     commit waits for a rebalance in progress, ~3 s measured, and would stall the
     partitions that did not move), synchronously on revoke and shutdown;
  3. append an InputProgress marker (completed-through = the committed offset) per
     agent input partition to its ActionState partition and wait for the ack (the
     marker states that those records finished, whether or not the commit landed);
  4. only then tombstone the ActionStates of records below the committed offsets
     (pruning): once a record's journal is gone, the durable marker is what says it is
     done, even if the group's offsets are reset later.

On assign, the partition's marker is read after the cache rebuild; records below it
are skipped (not run, not output) and committed past, unless ``App(rerun_completed=True)``.

Exactly-once (``App(processing_guarantee="exactly_once")``, :meth:`_transaction`): steps
2 and 3 are one Kafka transaction. The finished records' outputs, ActionDones and
snapshots are in it already (sent by the transactional producer as they finished); the
markers are added, then the offsets (``send_offsets_to_transaction`` with the consumer's
group metadata: the coordinator refuses them from a member of an old generation), then
it commits and the next begins. A commit that fails aborts the transaction: every
partition is then released as lost and taken again from its committed offsets (records
whose outputs were aborted run again, calls replayed), as after a freeze. A transaction
commits every ``commit_interval`` even when no offset moved (a slow record holding its
partition back), so it never outlives the broker's transaction timeout.

Commit bookkeeping (offsets, finished records) lives on the loop thread, where records
finish; the kafka thread only receives snapshots. A commit loop that dies of anything
but a Kafka error stops the worker with exit code 1.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from heapq import heappop
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, TopicPartition

from ..durable.acks import acked
from ..durable.journal import InputProgress
from ..errors import KafkaIOError
from ..kafka.transactions import TransactionalProducer, TransactionFailed

if TYPE_CHECKING:
    from confluent_kafka import Consumer

    from ..app import App
    from ..durable.ownership import Ownership
    from ..state.kafka import KafkaActionStateStore
    from .agent_host import AgentHost
    from .offsets import OffsetTracker

log = logging.getLogger("agents_stream.worker")


class CommitProtocol:
    """Steps 1-4 above. Expects the worker's bookkeeping (declared below)."""

    app: App
    worker_id: str
    shutdown_timeout: float
    consumer: Consumer
    store: KafkaActionStateStore | None
    offsets: OffsetTracker
    _agents: dict[str, AgentHost]
    _owned: set[tuple[str, int]]
    _finished: defaultdict[tuple[str, int], list[tuple[int, str]]]
    _marker_floor: dict[tuple[str, int], int]
    _completed_through: dict[tuple[str, int], int]
    _loop: asyncio.AbstractEventLoop | None
    ownership: Ownership

    transactions: TransactionalProducer | None
    stats: defaultdict[str, int]

    if TYPE_CHECKING:  # provided by the other units of the worker

        async def _on_kafka(self, fn: Any, *args: Any) -> Any: ...

        def _fail(self, exc: BaseException) -> None: ...

        def _suspected(self) -> None: ...

    # Offsets and finished records are bookkept on the loop, where records finish; only
    # snapshots cross to the kafka thread, so no dict is iterated while another thread
    # mutates it.
    async def _commit_loop(self) -> None:
        """Commit every ``commit_interval``; a failure other than Kafka's is fatal, since
        a dead commit loop would let the worker run on without ever committing."""
        while True:
            await asyncio.sleep(self.app.commit_interval)
            try:
                await self._commit(None, asynchronous=True)
            except KafkaIOError as exc:
                log.warning("commit failed (will retry): %s", exc)
            except Exception as exc:
                log.critical(
                    "commit loop failed (%s: %s): stopping the worker; uncommitted input "
                    "is re-consumed on restart",
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )
                self._fail(exc)
                return

    async def _commit(
        self, only: set[tuple[str, int]] | None, *, asynchronous: bool = False
    ) -> None:
        """Steps 1-4 of the commit protocol; runs on the loop, commits on the kafka thread."""
        if self.transactions is not None:
            await self._commit_transaction(only)
            return
        offsets = self._committable(only)
        if not offsets:
            return
        await self._on_kafka(self._commit_offsets, offsets, asynchronous)
        marked = await self._mark_progress(offsets)
        done = self._committed(offsets)
        if marked:  # unmarked: the records stay journaled, which is safe
            await self._on_kafka(self._prune, done)

    async def _commit_transaction(self, only: set[tuple[str, int]] | None) -> None:
        """Exactly-once: steps 1-4, steps 2 and 3 in the open transaction."""
        assert self.transactions is not None
        if self.ownership.suspended is not None:
            return  # the transaction is being aborted (worker_rebalance._after_freeze)
        offsets = self._committable(only)
        if not offsets and not self.transactions.sent:
            return
        try:
            await self._on_kafka(self._transaction, offsets)
        except TransactionFailed as exc:
            self._transaction_failed(exc)
            return
        done = self._committed(offsets)
        await self._on_kafka(self._prune, done)

    def _transaction(self, offsets: dict[tuple[str, int], int]) -> None:
        """Kafka thread: commit the open transaction with the completed-through markers
        and consumer offsets of ``offsets`` (raises TransactionFailed, aborted)."""
        transactions = self.transactions
        assert transactions is not None
        markers = self._progress_markers(offsets)
        for marker in markers:  # into the open transaction; its commit waits for them
            self.store.append([marker], marker.partition)  # type: ignore[union-attr]
        ownership = self.ownership

        def still_held() -> None:
            # The last look before the commit: a partition lost meanwhile must not have
            # its offsets (or anything of it) committed by this member.
            if ownership.suspended is not None:
                raise TransactionFailed(f"not committing: {ownership.suspended}")
            for tp in offsets:
                if not ownership.lease(*tp):
                    raise TransactionFailed(f"not committing: {tp[0]}[{tp[1]}] is not held")

        store = self.store

        def committed(queued: set[tuple[str, int | None]]) -> None:
            if store is not None:
                store.committed({p for t, p in queued if t == store.topic and p is not None})

        transactions.commit(
            [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
            self.consumer.consumer_group_metadata(),
            before=still_held,
            after=committed,
        )
        if not self.app.rerun_completed:  # as _mark_progress: markers now committed
            through = self._completed_through
            for marker in markers:
                tp = (marker.topic, marker.partition)
                if tp in self._owned:
                    through[tp] = max(through.get(tp, 0), marker.offset)

    def _transaction_failed(self, exc: TransactionFailed) -> None:
        """Loop thread: a transaction aborted (a fenced producer was replaced by a new
        one). Everything it held is gone, finished records of every partition included:
        all partitions are released as lost and taken again from their committed offsets
        (as after a freeze)."""
        log.warning("%s: every partition is taken again from its committed offsets", exc)
        self.stats["transactions_aborted"] += 1
        if self.ownership.suspended is None:
            self.ownership.suspend(f"transaction aborted ({exc})")
        self._suspected()

    def _committable(self, only: set[tuple[str, int]] | None) -> dict[tuple[str, int], int]:
        """Loop thread: a snapshot of the offsets to commit, of partitions held (none
        while the holds are suspended: durable/ownership.py)."""
        if self.ownership.suspended is not None:
            return {}
        lease = self.ownership.lease
        return {
            tp: o
            for tp, o in self.offsets.committable().items()
            if (only is None or tp in only) and tp in self._owned and lease(*tp)
        }

    def _commit_offsets(
        self, offsets: dict[tuple[str, int], int], asynchronous: bool = False
    ) -> None:
        """Kafka thread: commit the snapshot (an asynchronous commit's failure is logged
        by :meth:`_commit_done` and retried by the next commit)."""
        try:
            self.consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=asynchronous,
            )
        except Exception as exc:
            raise KafkaIOError(f"offset commit failed: {exc}") from exc

    def _commit_done(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Kafka thread (served by the consumer's poll): a failed commit is logged and
        its partitions made committable again, so the next commit retries them."""
        failed = list(partitions) if err is not None else [p for p in partitions if p.error]
        if not failed:
            return
        log.warning(
            "offset commit failed for %s (retried by the next commit): %s",
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in failed),
            err or failed[0].error,
        )
        if self._loop is not None:
            retry = [(tp.topic, tp.partition, tp.offset) for tp in failed]
            self._loop.call_soon_threadsafe(self._uncommit, retry)

    def _uncommit(self, failed: list[tuple[str, int, int]]) -> None:
        for topic, partition, offset in failed:
            tracker = self.offsets.partitions.get((topic, partition))
            if tracker is not None and offset >= 0:
                tracker.committed = min(tracker.committed, offset - 1)

    def _committed(
        self, offsets: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], list[tuple[int, str]]]:
        """Loop thread: record the commit; take the finished records it covers."""
        done: dict[tuple[str, int], list[tuple[int, str]]] = {}
        for tp, position in offsets.items():
            tracker = self.offsets.partitions.get(tp)
            if tracker is None:
                continue  # revoked meanwhile
            tracker.committed = max(tracker.committed, position)
            finished = self._finished.get(tp)
            if finished and finished[0][0] < position:
                # A heap by offset: a commit takes what it covers without walking the
                # records finished past it (thousands while a slow key holds it back).
                covered = done[tp] = []
                while finished and finished[0][0] < position:
                    covered.append(heappop(finished))
        return done

    def _prune(self, done: dict[tuple[str, int], list[tuple[int, str]]]) -> None:
        """Kafka thread: tombstone the ActionStates of committed records."""
        if self.store is None or not self.app.prune_completed:
            return
        for (topic, partition), records in done.items():
            if topic not in self._agents:
                continue
            self.store.prune_records(records, partition, topic)

    async def _mark_progress(self, offsets: dict[tuple[str, int], int]) -> bool:
        """Step 3: completed-through markers of the committed agent partitions; True when
        acked (pruning may go on), False when it must wait for the next commit."""
        markers = self._progress_markers(offsets)
        if not markers:
            return True
        try:
            for marker in markers:
                await acked(self.store.append([marker], marker.partition))  # type: ignore[union-attr]
        except Exception as exc:
            log.warning("completed-through marker not written (not pruning yet): %s", exc)
            return False
        # Records below a marker this worker wrote are done, as below one it found on
        # assignment: if the client hands them over again, they are skipped, not run
        # again with their journal pruned (acknowledged calls executed twice). Seen on
        # Apache Kafka: after an asynchronous commit failed (ILLEGAL_GENERATION around a
        # rebalance) the kept partitions were consumed again from the last committed
        # offset (tests/fault/test_zombie.py, test_failover.py, test_crash_window.py).
        if not self.app.rerun_completed:
            through = self._completed_through
            for marker in markers:
                tp = (marker.topic, marker.partition)
                if tp in self._owned:
                    through[tp] = max(through.get(tp, 0), marker.offset)
        return True

    def _progress_markers(self, offsets: dict[tuple[str, int], int]) -> list[InputProgress]:
        if self.store is None:
            return []
        now = int(time.time() * 1000)
        out = []
        for (topic, partition), position in offsets.items():
            if topic not in self._agents:
                continue
            # Never move a marker back (offsets reset below it re-commit lower positions).
            position = max(position, self._marker_floor.get((topic, partition), 0))
            self._marker_floor[(topic, partition)] = position
            out.append(InputProgress(topic, partition, position, now, self.worker_id))
        return out

    def _mark_progress_blocking(self, offsets: dict[tuple[str, int], int]) -> bool:
        """Kafka thread (revoke): :meth:`_mark_progress` waiting on the acks directly."""
        markers = self._progress_markers(offsets)
        try:
            for marker in markers:
                self.store.append([marker], marker.partition).result(  # type: ignore[union-attr]
                    timeout=self.shutdown_timeout
                )
        except Exception as exc:
            log.warning("completed-through marker not written on revoke: %s", exc)
            return False
        return True
