"""The group commit: what makes a group of finished records committed, in one function.

A worker commits every ``commit_interval`` and on revoke and shutdown
(``worker_commits.py`` decides when and with which offsets). :class:`GroupCommit` is the
step itself, on the Kafka thread: the consumer offsets of the records finished below
them, and their partitions' completed-through markers (``host/progress.py``), made
durable together as far as the guarantee allows. Two implementations:

* :class:`AtLeastOnceCommit`: the records' outputs and ActionDones are acked already;
  commit the offsets (asynchronously every interval, synchronously on revoke and
  shutdown), then append the markers and wait for their acks.
* :class:`TransactionalCommit` (exactly-once): the records' outputs and ActionDones are in
  the open transaction; add the markers, then the offsets with the group's metadata, and
  commit (``kafka/transactions.py``). Raises TransactionFailed (aborted).

Either returns whether the markers are durable: only then may the host prune the
journals of the records below them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ..durable.journal import InputProgress
from ..durable.ownership import Ownership, OwnershipLost
from ..errors import KafkaIOError
from ..host.progress import CompletedThrough
from ..kafka.deadline import GRACE, Blocked, Deadline
from ..kafka.transactions import TransactionalProducer, TransactionFailed
from ..state.kafka import KafkaActionStateStore

log = logging.getLogger("agents_stream.worker")

Offsets = dict[tuple[str, int], int]


class GroupCommit(Protocol):
    def commit(
        self, offsets: Offsets, markers: Sequence[InputProgress], *, asynchronous: bool
    ) -> bool:
        """Kafka thread: make ``offsets`` and ``markers`` durable; whether the markers
        are (pruning may follow). Raises KafkaIOError when the offsets are not."""
        ...

    @property
    def pending(self) -> bool:
        """Whether something waits for a commit even when no offset moved."""
        ...


def _positions(offsets: Offsets) -> list[TopicPartition]:
    return [TopicPartition(t, p, o) for (t, p), o in offsets.items()]


class AtLeastOnceCommit:
    """Offsets, then markers (the records' outputs are acked before they finish)."""

    pending = False

    def __init__(
        self,
        consumer: Consumer,
        progress: CompletedThrough | None,
        timeout: float,
        deadline: Deadline | None = None,
    ):
        self._consumer = consumer
        self._progress = progress
        self._timeout = timeout
        self._deadline = deadline or Deadline()

    def commit(
        self, offsets: Offsets, markers: Sequence[InputProgress], *, asynchronous: bool
    ) -> bool:
        # An asynchronous commit's failure is logged by the consumer's on_commit callback
        # (worker_commits.Commits.commit_done) and retried by the next commit. A synchronous one
        # (revoke, shutdown) waits for a rebalance in progress, ~3 s measured: not every
        # interval, or the partitions that did not move would stall.
        if offsets:
            positions = _positions(offsets)
            try:
                if asynchronous:
                    self._consumer.commit(offsets=positions, asynchronous=True)
                else:  # librdkafka waits for the coordinator without a timeout of its own
                    self._deadline.call(
                        "offset commit", self._timeout + GRACE, self._commit_now, positions
                    )
            except Blocked:
                raise
            except Exception as exc:
                raise KafkaIOError(f"offset commit failed: {exc}") from exc
        # The markers state that the records finished, whether or not the commit landed.
        if not markers or self._progress is None:
            return True
        return self._progress.write(markers, self._timeout)

    def _commit_now(self, positions: list[TopicPartition]) -> None:
        self._consumer.commit(offsets=positions, asynchronous=False)


class TransactionalCommit:
    """Markers and offsets into the open transaction, then commit it."""

    def __init__(
        self,
        consumer: Consumer,
        producer: TransactionalProducer,
        store: KafkaActionStateStore | None,
        ownership: Ownership,
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._store = store
        self._ownership = ownership

    @property
    def pending(self) -> bool:
        # A transaction with records commits even when no offset moved (a slow record
        # holding its partition back): none may outlive transaction.timeout.ms.
        return self._producer.sent > 0

    def commit(
        self, offsets: Offsets, markers: Sequence[InputProgress], *, asynchronous: bool
    ) -> bool:
        store, ownership = self._store, self._ownership
        try:
            for marker in markers:  # into the open transaction; its commit waits for them
                assert store is not None
                store.append([marker], marker.partition)
        except OwnershipLost as exc:
            # Only a suspension of every hold gets here (a partition revoked since the
            # snapshot is excluded before): abort, as for any partition lost.
            raise TransactionFailed(f"not committing: {exc}") from exc
        except KafkaIOError as exc:
            # The producer refused the write (fatal: fenced by a newer instance of its
            # transactional.id): this transaction cannot commit; the recovery aborts it
            # and replaces a fenced producer, instead of the commit loop stopping.
            raise TransactionFailed(
                f"not committing: {exc}", fenced=exc.code == KafkaError._FATAL, code=exc.code
            ) from exc

        def still_held() -> None:
            # The last look before the commit: a partition lost meanwhile must not have
            # its offsets (or anything of it) committed by this member.
            if ownership.suspended is not None:
                raise TransactionFailed(f"not committing: {ownership.suspended}")
            for topic, partition in offsets:
                # valid(): held, and no freeze past the limit the watchdog has not seen yet
                if not ownership.valid(topic, partition, ownership.lease(topic, partition)):
                    raise TransactionFailed(f"not committing: {topic}[{partition}] is not held")

        committed: Callable[[set[tuple[str, int | None]]], None] | None = None
        if store is not None:

            def committed(queued: set[tuple[str, int | None]]) -> None:
                # Caches with sends queued for the next transaction stay uncommitted.
                store.committed({p for t, p in queued if t == store.topic and p is not None})

        self._producer.commit(
            _positions(offsets),
            self._consumer.consumer_group_metadata(),
            before=still_held,
            after=committed,
        )
        return True
