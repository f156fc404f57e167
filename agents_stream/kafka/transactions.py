"""TransactionalProducer: the exactly-once producer of a worker (KIP-98, KIP-447).

In ``processing_guarantee="exactly_once"`` a worker has two producers. Journaled calls
(CallResults, PENDING, truncations) stay on the idempotent producer: guarantee 1 needs a
call's result durable *before* the action sees it, which a transaction only makes at its
commit. Everything a finished record writes (outputs, ActionDones, memory snapshots,
timers, dead letters, completed-through markers) goes through this one, and every group
commit is one transaction with the consumer offsets in it
(``send_offsets_to_transaction`` with the consumer's group metadata): a ``read_committed``
reader sees a record's outputs exactly when its offset is committed.

Records are sent from several threads (the event loop, the thread serving delivery
reports, which chains outputs on ActionDone acks) while librdkafka refuses a produce
once a commit started. So a commit first *holds* the gate: sends from then on are
queued here (their futures work as usual), sends already inside ``produce`` finish;
after the commit the next transaction begins and the queued sends are produced into it.
Nothing blocks a sender, so a delivery-report callback can never wait for a commit that
waits for it. An abort fails the queued sends instead: they belong to work the host is
abandoning (it releases every partition after an abort), and must not slip into the
next transaction.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from ..errors import KafkaIOError
from .deadline import GRACE, Blocked, Deadline
from .producer import AckingProducer

log = logging.getLogger("agents_stream.transactions")

# Fault injection for the crash tests (tests/fault/test_transactions.py): SIGKILL this
# process at one step of the first commit that carries offsets and at least 20 records
# (outputs, ActionDones). Never set in production.
_KILL_AT = os.environ.get("AGENTS_STREAM_TEST_KILL_IN_TRANSACTION", "")
# The same for a call that never returns (tests/fault/test_blocked_call.py): at the first
# such commit, the named call ("send offsets", "commit") is made, then blocks forever, as
# librdkafka's did when the group coordinator's broker shut down. Never set in production.
_BLOCK_AT = os.environ.get("AGENTS_STREAM_TEST_BLOCK_IN_TRANSACTION", "")

# An abort that keeps timing out is given up after this many tries in a row, and the
# producer replaced (see _recover).
ABORTS_BEFORE_RENEWAL = 3

_Send = tuple[
    str,
    bytes | None,
    bytes | None,
    int | None,
    list[tuple[str, bytes]] | None,
    Callable[[KafkaError | None, Message], None] | None,
]


class TransactionFailed(KafkaIOError):
    """A transaction did not commit (it was aborted, or the producer was fenced): none of
    its records is visible to ``read_committed`` readers. ``fenced``: this producer can
    never be used again (another one with its transactional.id, or a broker that
    fenced it); otherwise the next transaction may begin after the abort."""

    def __init__(self, message: str, *, fenced: bool = False, code: int | None = None) -> None:
        super().__init__(message, code=code)
        self.fenced = fenced

    @property
    def denied(self) -> bool:
        """Refused by the cluster's authorizer: no retry or new producer fares better."""
        return self.code in _DENIED


class TransactionalProducer(AckingProducer):
    """An :class:`AckingProducer` whose sends belong to the open transaction."""

    def __init__(
        self, config: dict[str, Any], *, timeout: float = 30.0, deadline: Deadline | None = None
    ) -> None:
        if not config.get("transactional.id"):
            raise ValueError("a TransactionalProducer needs transactional.id")
        super().__init__(config)
        self.transactional_id = str(config["transactional.id"])
        self.timeout = timeout
        # Every transactional call runs under a deadline this process enforces: librdkafka
        # does not always keep the timeout it is given (kafka/deadline.py).
        self.deadline = deadline or Deadline()
        self._initialised = False  # init_transactions succeeded on the current producer
        self._aborting = False  # an abort timed out: the next abort() resumes it
        self._abort_timeouts = 0  # in a row, on the current producer
        self._resume_init = False  # a renewal's init timed out: the next recovery resumes it
        self._gate = threading.Condition()
        self._held: list[_Send] | None = None  # sends queued while a commit runs
        self._producing = 0  # sends inside produce() right now
        self._open = False
        # A transaction is begun: librdkafka refuses a produce outside one (_STATE), and
        # between a failed commit and the host's recovery (an abort or a renewal that
        # timed out, retried with a backoff) none is. Read and set under the gate.
        self._begun = False
        self.sent = 0  # records produced into the open transaction
        self.commits = 0
        self.aborts = 0
        self.renewals = 0

    # -- the transaction ------------------------------------------------------------------
    def begin(self, patience: float = 60.0) -> None:
        """Initialise (fencing older producers of this transactional.id and aborting
        their open transaction) on first use, then begin a transaction.

        The first initialisation may wait for the cluster: on a new replicated cluster
        the transaction log is created (RF 3) by the first producer that asks, which
        took over 10 s on three nodes. A timeout is retried (librdkafka resumes the
        same call) for up to ``patience`` seconds."""
        try:
            if not self._open:
                give_up = time.monotonic() + patience
                while True:
                    try:
                        self._call("init", self.producer.init_transactions, self.timeout)
                        break
                    except KafkaException as exc:
                        error = exc.args[0] if exc.args else None
                        retriable = isinstance(error, KafkaError) and error.retriable()
                        if not retriable or time.monotonic() >= give_up:
                            raise
                        log.info("transactions not initialised yet (%s): retrying", error)
                self._initialised = self._open = True
            with self._gate:
                self.producer.begin_transaction()
                self._begun = True
        except KafkaException as exc:
            raise _failed("begin", exc) from exc

    def _call(self, step: str, fn: Callable[..., None], *args: Any) -> None:
        """A transactional call under the deadline; one that blocks past it leaves this
        producer unusable (its transaction state unknown): TransactionFailed as fenced,
        so the producer is replaced and the stuck transaction fenced by the new one."""
        if step == _BLOCK_AT and self.sent >= 20 and not self.deadline.count:
            fn = _blocking(fn)
        try:
            self.deadline.call(f"transaction {step}", self.timeout + GRACE, fn, *args)
        except Blocked as exc:
            self._initialised = False
            raise TransactionFailed(str(exc), fenced=True) from exc

    def commit(
        self,
        offsets: list[TopicPartition],
        group_metadata: Any,
        *,
        before: Callable[[], None] | None = None,
        after: Callable[[set[tuple[str, int | None]]], None] | None = None,
    ) -> None:
        """Commit the open transaction with ``offsets`` (of ``group_metadata``'s group) and
        begin the next. ``before`` runs once every send is acknowledged and none can
        start (a last check: raising aborts); ``after`` once the commit succeeded, with
        the topics and partitions of the sends queued for the next transaction.

        Raises :class:`TransactionFailed`; the transaction is then aborted (unless
        fenced), queued sends fail, and the next one is begun."""
        self._hold()
        ok = False
        try:
            left = self.flush(self.timeout)
            if left:
                raise TransactionFailed(f"{left} records not acknowledged before the commit")
            if before is not None:
                before()
            producer = self.producer
            # The crash tests' kill points: a commit that holds finished records.
            faulty = bool(offsets) and self.sent >= 20
            if offsets:
                _step("before-offsets", faulty)
                self._call(
                    "send offsets",
                    producer.send_offsets_to_transaction,
                    offsets,
                    group_metadata,
                    self.timeout,
                )
                _step("before-commit", faulty)
            self._call("commit", producer.commit_transaction, self.timeout)
            _step("after-commit", faulty)
            self.commits += 1
            self.sent = 0
            ok = True
            if after is not None:
                after({(send[0], send[3]) for send in self._held or ()})
        except KafkaException as exc:
            failure = _failed("commit", exc)
            self._recover(failure)
            raise failure from exc
        except Exception as exc:
            self._recover(exc if isinstance(exc, TransactionFailed) else None)
            raise
        finally:
            self._release(produce=ok)

    def abort(self) -> None:
        """Abort the open transaction (its records are never visible), fail the sends
        queued meanwhile, and begin the next."""
        self._hold()
        try:
            self._recover(None)
        finally:
            self._release(produce=False)

    def _recover(self, failure: TransactionFailed | None) -> None:
        """Abort the open transaction; a fenced producer (its epoch bumped: the broker
        aborted a transaction that outlived ``transaction.timeout.ms``, as a frozen
        worker's does, or another producer took its transactional.id) is replaced by a
        new one, whose initialisation aborts whatever the old one left open."""
        self.aborts += 1
        self.sent = 0
        if not self._initialised and failure is None and self._resume_init:
            # The last renewal's initialisation timed out (a coordinator not available
            # yet): librdkafka goes on with it in the background, so it is resumed on
            # the same producer. A new one instead would be fenced by the old one's
            # initialisation completing later (seen on a three-node cluster below min
            # ISR: the replacement's next write failed "fenced by a newer instance").
            try:
                self._call("init", self.producer.init_transactions, self.timeout)
            except TransactionFailed as blocked:  # past the deadline: a new producer
                failure = blocked
            except KafkaException as exc:
                failure = _failed("init", exc)
                if _retriable(exc) and not failure.fenced:
                    raise failure from exc  # the host's recovery tries again later
            else:
                self._initialised, self._resume_init = True, False
                return
        if not self._initialised and failure is None:
            # A renewal that did not complete: nothing to abort, try it once more.
            failure = TransactionFailed(
                "the transactional producer is not initialised", fenced=True
            )
        if failure is None or not failure.fenced:
            try:
                self._call("abort", self.producer.abort_transaction, self.timeout)
            except TransactionFailed as blocked:
                failure = blocked
            except KafkaException as exc:
                failure = _failed("abort", exc)
                # _CONFLICT: a commit that timed out (a coordinator or leader moving) is
                # still "in progress" in librdkafka, and every abort conflicts with it
                # until it is resumed; seen on a three-node cluster, where the worker
                # retried the abort every 10 s and never processed again. A new producer
                # settles it instead (see _renew), as for a fenced one.
                # Timed out again and again: on the three-node test cluster an abort
                # after a cut and a whole-cluster restart timed out every 10 s for over
                # two minutes (librdkafka waiting on a coordinator answer that never
                # came, as in confluentinc/librdkafka#5456), and the worker processed
                # nothing. A new producer's initialisation settles the transaction at
                # the coordinator instead.
                self._abort_timeouts += 1
                patient = self._abort_timeouts < ABORTS_BEFORE_RENEWAL
                if not failure.fenced and failure.code != KafkaError._CONFLICT and patient:
                    # Timed out (a coordinator moving): the host calls abort() again,
                    # which resumes this one; no transaction may begin meanwhile.
                    self._aborting = True
                    raise failure from exc
            else:
                self._aborting = False
                self._abort_timeouts = 0
                # Reports of the aborted records (failed or not) are dispatched before the
                # new transaction: none of them may be taken for one of the next.
                self.flush(self.timeout)
                return
        self._renew(failure)

    def _renew(self, why: TransactionFailed) -> None:
        """A new producer with the same transactional.id: its initialisation bumps the
        epoch, so the broker fences the old one and aborts its open transaction (or
        completes one it was already committing) before the new one may begin: whatever
        the old producer was doing, even stuck in a call, can no longer commit."""
        log.warning("%s: replacing the transactional producer %s", why, self.transactional_id)
        old = self._producer
        stuck = self.deadline.abandoned > 0
        if old is not None:
            try:  # its records in flight fail now (their reports dispatched as usual)
                # Not waiting on a producer that a stuck call may still be inside.
                old.purge(blocking=not stuck)
                old.poll(0)
            except Exception:  # a fatal producer may refuse even that
                pass
        self.renewals += 1
        self._initialised = self._aborting = False
        self._abort_timeouts = 0
        with self._lock:  # whoever serves the reports reads _producer every round
            self._producer = Producer(self._config)
        self._dispatch()
        self._resume_init = False
        try:
            self._call("init", self._producer.init_transactions, self.timeout)
        except KafkaException as exc:
            # Timed out: resumed by the next recovery (see _recover), not replaced.
            self._resume_init = _retriable(exc)
            raise _failed("init", exc) from exc
        self._initialised = True

    # -- the gate ---------------------------------------------------------------------------
    def _hold(self) -> None:
        with self._gate:
            self._held = []
            self._begun = False  # a commit or an abort ends it
            while self._producing:
                self._gate.wait()

    def _release(self, *, produce: bool) -> None:
        with self._gate:
            # Begun before the gate opens: a send that comes in right after must find
            # the transaction open. Not after an abort that did not finish, nor before a
            # renewal completes: the host's recovery calls abort() again, and sends
            # meanwhile are refused (see _produce).
            if self._open and self._initialised and not self._aborting:
                try:
                    self.producer.begin_transaction()
                    self._begun = True
                except KafkaException as exc:
                    log.error("next transaction did not begin: %s", exc)
            held, self._held = self._held or [], None
        if not produce:
            for topic, value, key, partition, _, delivered in held:
                if delivered is not None:
                    delivered(_ABORTED, _Unsent(topic, partition, key, value))
            return
        for send in held:
            self.sent += 1
            super()._produce(*send)

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        headers: list[tuple[str, bytes]] | None,
        delivered: Callable[[KafkaError | None, Message], None] | None,
    ) -> None:
        with self._gate:
            if self._held is not None:
                self._held.append((topic, value, key, partition, headers, delivered))
                return
            if not self._begun:
                # A failed commit whose recovery has not completed (an abort or a
                # renewal timed out: a coordinator moving, below min ISR). The host
                # releases every partition after it; this record is abandoned with
                # them (host/policy.py undelivered), never taken for an action error
                # and dead-lettered, as librdkafka's own refusal (_STATE) was.
                raise KafkaIOError(
                    f"a write to {topic} was not taken: no transaction is open (the "
                    "transactional producer is being recovered)",
                    code=KafkaError._STATE,
                )
            self._producing += 1
            self.sent += 1
        try:
            super()._produce(topic, value, key, partition, headers, delivered)
        finally:
            with self._gate:
                self._producing -= 1
                if not self._producing:
                    self._gate.notify_all()


_DENIED = frozenset(
    {KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED}
)
_ABORTED = KafkaError(KafkaError._PURGE_QUEUE, "transaction aborted before this record was sent")


class _Unsent:
    """What a delivery report's callback reads of a message, for a send that was queued
    during a commit and failed by the abort without ever reaching the client."""

    __slots__ = ("_key", "_partition", "_topic", "_value")

    def __init__(self, topic: str, partition: int | None, key: bytes | None, value: bytes | None):
        self._topic, self._partition, self._key, self._value = topic, partition, key, value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return -1 if self._partition is None else self._partition

    def offset(self) -> int:
        return -1

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


def _step(name: str, armed: bool) -> None:
    if armed and name == _KILL_AT:
        log.warning("killed in the transaction (%s): AGENTS_STREAM_TEST_KILL_IN_TRANSACTION", name)
        os.kill(os.getpid(), signal.SIGKILL)


def _blocking(fn: Callable[..., None]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        log.warning("blocking in the transaction: AGENTS_STREAM_TEST_BLOCK_IN_TRANSACTION")
        fn(*args)
        threading.Event().wait()

    return call


def _retriable(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.retriable() and not error.fatal()


def _failed(step: str, exc: KafkaException) -> TransactionFailed:
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return TransactionFailed(f"transaction {step} failed: {exc}")
    if error.code() in _DENIED:
        # Not fencing: no new producer would fare better. One line naming the ACL.
        return TransactionFailed(
            f"transaction {step} refused by the cluster's authorizer ({error.str()}): grant "
            "Write and Describe on TransactionalId with the prefix '<app id>-' "
            "(`agents-stream acls -A module:app` prints it)",
            code=error.code(),
        )
    fenced = error.fatal() or error.code() in (
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError._FENCED,
    )
    what = "fenced" if fenced else "aborted"
    return TransactionFailed(
        f"transaction {step} failed ({what}): {error.str()}", fenced=fenced, code=error.code()
    )
