"""The worker's commit protocol (:class:`Commits`, a part of :class:`~agents_stream.runtime.worker.Worker`).

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
are skipped (not run, not output) and committed past, unless ``App(rerun_completed=True)``
(markers, written once for every host: ``host/progress.py``).

Steps 2 and 3 are the group commit (``runtime/commit.py``), one function with two
implementations. Exactly-once (``App(processing_guarantee="exactly_once")``): steps
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
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import KafkaError, TopicPartition

from ..durable.faultpoints import POINTS as FAULT_POINTS
from ..durable.faultpoints import reached as fault_reached
from ..durable.ownership import OwnershipLost
from ..errors import KafkaIOError
from ..kafka.transactions import TransactionFailed

if TYPE_CHECKING:
    from ..app import App
    from ..durable.ownership import Ownership
    from ..host.progress import CompletedThrough
    from ..state.kafka import KafkaActionStateStore
    from .agent_host import AgentHost
    from .commit import GroupCommit
    from .partition import Partition as Held
    from .worker_rebalance import Rebalance

log = logging.getLogger("agents_stream.worker")


Partition = tuple[str, int]


class Snapshot(dict[Partition, int]):
    """Offsets to commit, taken on the loop, with the hold (``Ownership`` generation)
    each partition had then. The commit runs later on the kafka thread, where the
    rebalance callbacks run too: by then a partition may have been revoked (its own
    commit done in the callback) or lost, or revoked and assigned again (a new hold).
    :meth:`held` is what is still held under the same hold, decided on that thread, so no
    callback can change it before the commit is made."""

    def __init__(
        self, offsets: dict[Partition, int], leases: dict[Partition, int], *, fence: bool = False
    ) -> None:
        super().__init__(offsets)
        self.leases = leases
        # No offset moved: these are the unchanged positions, committed again only so
        # that the transaction carries the group's metadata (see Commits.commit); no
        # completed-through marker is written for them.
        self.fence = fence

    def held(self, lease: Callable[[str, int], int]) -> dict[Partition, int]:
        return {tp: o for tp, o in self.items() if lease(*tp) == self.leases.get(tp, -1)}


class CommitHost(Protocol):
    """What the commit protocol reads of the worker."""

    app: App
    store: KafkaActionStateStore | None
    committer: GroupCommit
    progress: CompletedThrough | None
    _agents: dict[str, AgentHost]
    partitions: dict[tuple[str, int], Held]
    _loop: asyncio.AbstractEventLoop | None
    ownership: Ownership
    stats: defaultdict[str, int]

    async def _on_kafka(self, fn: Any, *args: Any) -> Any: ...

    rebalance: Rebalance

    def _fail(self, exc: BaseException) -> None: ...


class Commits:
    """Steps 1-4 above, for the worker ``w``: reads its bookkeeping (:class:`CommitHost`),
    owns no state of its own."""

    def __init__(self, w: CommitHost) -> None:
        self._w = w

    # Offsets and finished records are bookkept on the loop, where records finish; only
    # snapshots cross to the kafka thread, so no dict is iterated while another thread
    # mutates it.
    async def run(self) -> None:
        """Commit every ``commit_interval``; a failure other than Kafka's is fatal, since
        a dead commit loop would let the worker run on without ever committing."""
        while True:
            await asyncio.sleep(self._w.app.commit_interval)
            try:
                await self.commit(None, asynchronous=True)
            except KafkaIOError as exc:
                log.warning("commit failed (will retry): %s", exc)
            except OwnershipLost as exc:
                # A hold ended under the commit (the watchdog's suspension, a loss): what
                # it would have written is the partition's next owner's to write.
                log.warning("commit skipped: %s", exc)
            except Exception as exc:
                log.critical(
                    "commit loop failed (%s: %s): stopping the worker; uncommitted input "
                    "is re-consumed on restart",
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )
                self._w._fail(exc)
                return

    async def commit(
        self, only: set[tuple[str, int]] | None, *, asynchronous: bool = False
    ) -> None:
        """Steps 1-4 of the commit protocol; runs on the loop, commits on the kafka thread."""
        if self._w.ownership.suspended is not None:
            return  # every hold is in doubt (and a transaction being aborted)
        offsets = self.committable(only)
        if not offsets:
            if not self._w.committer.pending:
                return
            # Pending: a transaction with records (at-least-once has none) and no
            # offset moved (a slow record holding its partition back). Without offsets
            # it would commit with no check of the group's generation: a member that
            # lost its partitions and has not heard yet (cut off, then back) would
            # commit outputs and ActionDones of records their next owner runs again.
            # The positions again, unchanged, make the coordinator fence it (KIP-447).
            offsets = self.committable(only, unchanged=True)
        try:
            marked, held = await self._w._on_kafka(self.group_commit, offsets, asynchronous)
        except TransactionFailed as exc:
            self.transaction_failed(exc)
            return
        done = self.committed(held)
        if marked:  # unmarked: the records stay journaled, which is safe
            await self._w._on_kafka(self.prune, done)

    def group_commit(
        self, offsets: Snapshot, asynchronous: bool
    ) -> tuple[bool, dict[Partition, int]]:
        """Kafka thread: steps 2 and 3 (``runtime/commit.py``) for the partitions of
        ``offsets`` still held under the hold they were snapshotted with (the others
        were revoked or lost meanwhile: their own callback committed or fenced them).
        Returns whether the markers are durable and the offsets committed. Also the
        revoke's commit (synchronous, inside the callback)."""
        held = offsets.held(self._w.ownership.lease)
        if len(held) < len(offsets):
            gone = sorted(set(offsets) - set(held))
            self._w.stats["commit_partitions_excluded"] += len(gone)
            log.info(
                "commit: %s no longer held since the snapshot (revoked or lost): excluded",
                ", ".join(f"{t}[{p}]" for t, p in gone),
            )
        progress = self._w.progress
        agents = {tp: o for tp, o in held.items() if tp[0] in self._w._agents}
        if offsets.fence:
            agents = {}
        markers = progress.markers(agents) if progress is not None and agents else []
        if FAULT_POINTS and held:
            fault_reached("commit")
        marked = self._w.committer.commit(held, markers, asynchronous=asynchronous)
        if marked and progress is not None:
            progress.written(markers, self._w.partitions)
        return marked, held

    def transaction_failed(self, exc: TransactionFailed) -> None:
        """Loop thread: a transaction aborted (a fenced producer was replaced by a new
        one). Everything it held is gone, finished records of every partition included:
        all partitions are released as lost and taken again from their committed offsets
        (as after a freeze)."""
        log.warning("%s: every partition is taken again from its committed offsets", exc)
        self._w.stats["transactions_aborted"] += 1
        if self._w.ownership.suspended is None:
            self._w.ownership.suspend(f"transaction aborted ({exc})")
        self._w.rebalance.suspected()

    def committable(
        self, only: set[tuple[str, int]] | None, *, unchanged: bool = False
    ) -> Snapshot:
        """Loop thread: a snapshot of the offsets to commit, of partitions held, with
        their holds (none while the holds are suspended: durable/ownership.py).
        ``unchanged``: every held partition's position, moved or not (a fence)."""
        if self._w.ownership.suspended is not None:
            return Snapshot({}, {})
        lease = self._w.ownership.lease
        offsets, leases = {}, {}
        for tp, part in list(self._w.partitions.items()):
            if only is not None and tp not in only:
                continue
            o = part.offsets.committable()
            if unchanged and part.offsets.oldest >= 0:
                o = part.offsets.oldest
            if o is not None:
                hold = lease(*tp)
                if hold:
                    offsets[tp] = o
                    leases[tp] = hold
        return Snapshot(offsets, leases, fence=unchanged)

    def commit_done(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
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
        if self._w._loop is not None:
            retry = [(tp.topic, tp.partition, tp.offset) for tp in failed]
            self._w._loop.call_soon_threadsafe(self._uncommit, retry)

    def _uncommit(self, failed: list[tuple[str, int, int]]) -> None:
        for topic, partition, offset in failed:
            part = self._w.partitions.get((topic, partition))
            if part is not None and offset >= 0:
                part.uncommit(offset)

    def committed(
        self, offsets: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], list[tuple[int, str]]]:
        """Loop thread: record the commit; take the finished records it covers."""
        done: dict[tuple[str, int], list[tuple[int, str]]] = {}
        for tp, position in offsets.items():
            part = self._w.partitions.get(tp)
            if part is None:
                continue  # revoked meanwhile
            covered = part.committed(position)
            if covered:
                done[tp] = covered
        return done

    def prune(self, done: dict[tuple[str, int], list[tuple[int, str]]]) -> None:
        """Kafka thread: tombstone the ActionStates of committed records."""
        if self._w.store is None or not self._w.app.prune_completed:
            return
        if FAULT_POINTS and done:
            fault_reached("prune")
        for (topic, partition), records in done.items():
            if topic not in self._w._agents:
                continue
            self._w.store.prune_records(records, partition, topic)
