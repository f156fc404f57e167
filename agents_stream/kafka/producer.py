"""AckingProducer: produce with linger and hand back a future per record.

Delivery reports are polled from librdkafka by one thread: a background thread of the
producer's own, or an event loop's thread between its callbacks (:meth:`serve_on`).
Reports are gathered per poll and handed to ``on_acked`` hooks *before* the futures
resolve, so a hook (the RocksDB cache) can apply a whole poll's worth of acks in one
write batch and a waiter never observes an acked record that the cache does not have yet.

Why a loop may serve them: the worker is bound by the GIL, and its loop and a poll thread
took it from each other a few times per record (the report callbacks, the cache writes,
the outputs and markers chained on acks all ran on the poll thread). Served from the
loop, the same work runs without those hand-offs, and the futures it resolves wake their
waiters on the thread they wait on (measured: 20 % less CPU per record, see
bench/HISTORY.md, nineteenth round).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..ackfuture import AckFuture
from ..durable.ownership import OwnershipLost
from ..errors import KafkaIOError, RecordRefusedError

AckHook = Callable[[list["Ack"]], None]
T = TypeVar("T")

# A loop serving reports polls this often while records await their reports, and waits
# at most this long for a send when none do.
LOOP_SERVE_S = 0.001
LOOP_IDLE_S = 0.05
# A poll thread's poll waits at most this long for a report, or this while a flush waits.
POLL_IDLE_S = 0.05
POLL_HURRIED_S = 0.001
# A long synchronous stretch of the serving loop serves reports in between once the last
# round is this old (serve_due): fewer, larger rounds than every LOOP_SERVE_S.
DUE_AFTER_S = 0.003


@dataclass
class Ack:
    """A delivery report as the hooks and futures see it: one record (``key``,
    ``value``), or a whole group of one partition (``records``, see :class:`_Group`),
    whose ``offset`` is then its last record's (or lower: only ever used as the highest
    offset the cache has seen)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    future: Future[None] | _Countdown
    error: KafkaError | None = None
    sent: float = 0.0  # time.monotonic() at produce
    records: Sequence[tuple[bytes | None, bytes | None]] | None = None
    # A failed group's records that did not reach the log, when known (see KafkaIOError).
    lost: list[tuple[bytes | None, bytes | None]] | None = None


def _offset(msg: Message) -> int:
    """A delivered record's offset, -1 when the broker did not say (moves no cache
    checkpoint). confluent-kafka gives None then: seen on the three-node test cluster
    after a leader change, for a retried batch the new leader acked as a duplicate of one
    it already had. The ack hook's ``max`` of None and an offset failed every record of
    the poll (three records dead-lettered for "ack hook failed")."""
    offset = msg.offset()
    return -1 if offset is None else offset


class _Countdown:
    """Stands in for the future of each record of a group sent by
    :meth:`AckingProducer.send_all` whose records are reported one by one (a hooked
    topic without a partition): the group's one future resolves when the last of them
    is acked, or with the first failure. Only the poll thread's ``_dispatch`` resolves
    acks, so it needs no lock."""

    __slots__ = ("future", "left")

    def __init__(self, future: AckFuture[None], left: int) -> None:
        self.future = future
        self.left = left

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, _: None) -> None:
        self.left -= 1
        if self.left == 0:
            self.future.set_result(None)

    def set_exception(self, exc: BaseException) -> None:
        self.future.set_exception(exc)


# Errors about a record itself: the same record fails again, the others sent with it
# are not at fault (the batch path appends a refused group's records one by one).
_REFUSED = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD}
)
# Sends purged by the client on this host's request (only when it aborts a transaction).
_DROPPED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


class _Group:
    """Records of one partition sent together, reported as one :class:`Ack` once the
    last of ``expected`` delivery reports is in.

    Why: every report takes the GIL, and per record the client built a Message, called
    a partial, and the producer built an Ack that its dispatch, the cache hook, the
    futures and the metrics each walked again: a few microseconds per record on the
    thread that the event loop waits for. Now a report is a counter step, and the hooks
    and the futures see one Ack per group.

    The cache's checkpoint must never pass a record it lacks (a crash would then leave
    that record out of the cache for good), and a group's records reach the cache only
    with its last report. So the records of a hooked topic are produced under one lock:
    a group stays contiguous in its partition, the broker acks it in that order, and no
    later record of the partition is reported before the group is complete.

    For the same reason only the poll thread serves reports while it runs: a sender
    whose queue is full waits for it instead of polling, and ``flush`` waits for its
    rounds (a group completed on another thread could otherwise be dispatched after a
    later group of its partition). The count is still an ``itertools.count`` (one C
    call, atomic under the GIL) and a failure is noted *before* it is counted: whoever
    takes the last count sees every failure."""

    __slots__ = ("_count", "_producer", "expected", "failed", "future", "records", "sent")

    def __init__(
        self,
        producer: AckingProducer,
        records: Sequence[tuple[bytes | None, bytes | None]],
        future: AckFuture[None],
        expected: int,
        sent: float,
    ) -> None:
        self._producer = producer
        self.records = records
        self.future = future
        self.expected = expected
        self.sent = sent
        self._count = itertools.count(1)
        self.failed: list[tuple[KafkaError, Message]] = []

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed.append((err, msg))
        if next(self._count) == self.expected:
            self._producer._group_done(self, msg)


class AckingProducer:
    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._max_message_bytes = int(config.get("message.max.bytes", 1_000_000))
        self._producer: Producer | None = None
        self._hooks: dict[str, AckHook] = {}
        self._batch: list[Ack] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._batch_lock = threading.Lock()
        # Held while a hooked topic's records are produced (see _Group: its records stay
        # contiguous in their partition, so groups are acked in the order they were sent).
        self._send_lock = threading.Lock()
        self._observers: list[AckHook] = []
        self._rounds = 0  # poll-and-dispatch rounds of the poll thread (or serving loop)
        self._hurry = False  # a flush waits for the next rounds (see flush)
        # Set by serve_on: the loop whose thread serves the reports instead of _thread.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: threading.Thread | None = None
        self._serving_done = threading.Event()
        self._idle = False  # the serving loop waits for a send (see _serve)
        self._last_round = 0.0  # monotonic time of the serving loop's last round
        self._in_round = False
        self._kick: asyncio.Event | None = None

    def observe_acks(self, hook: AckHook) -> None:
        """Also call ``hook`` with every poll's whole batch, after it is resolved (metrics:
        it sees failures too and cannot delay a waiter)."""
        self._observers.append(hook)

    def on_acked(self, topic: str, hook: AckHook) -> None:
        """Call ``hook`` with each poll's successful acks of ``topic`` before resolving them."""
        self._hooks[topic] = hook

    @property
    def producer(self) -> Producer:
        # Hot path (every send): no lock once built; the lock only guards the first build.
        built = self._producer
        if built is not None:
            return built
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self._config)
                if self._loop is None:
                    self._start_thread()
                else:
                    self._loop.call_soon_threadsafe(self._start_serving)
            return self._producer

    def _start_thread(self) -> None:
        self._thread = threading.Thread(
            target=self._poll_loop, name="agents-stream-producer", daemon=True
        )
        self._thread.start()

    def serve_on(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        """Serve delivery reports from ``loop`` (running on ``thread``) instead of a poll
        thread: a task of the loop polls every millisecond while records await their
        reports (after every loop round while reports keep coming), and a long stretch
        of the loop serves them in between (:meth:`serve_due`). A blocking wait for an
        ack on ``thread`` must go through :meth:`wait`, which serves them meanwhile. This
        producer is the core's ``AckServing`` port (durable/acks.py). Call before
        :meth:`close`; if the poll thread was started already, it hands over."""
        with self._lock:
            self._loop, self._server = loop, thread
            started = self._producer is not None
        if not started:
            return
        poller = self._thread
        if poller is not None:  # hand over: the thread stops after its current round
            self._thread = None
            poller.join(timeout=5)
        loop.call_soon_threadsafe(self._start_serving)

    def _start_serving(self) -> None:
        if not self._stop.is_set():
            self._serving = asyncio.ensure_future(self._serve())

    def _serve_once(self, timeout: float = 0.0) -> int:
        assert self._producer is not None
        self._last_round = time.monotonic()
        self._in_round = True
        try:
            served: int = self._producer.poll(timeout)
            self._dispatch()
        finally:
            self._in_round = False
        self._rounds += 1
        return served

    def serve_due(self) -> None:
        """On the thread that serves the reports (:meth:`serve_on`), in a long stretch of
        its other work: a round now if the last one is over ``DUE_AFTER_S`` old; not
        from inside a round (a callback of a report), which would resolve later acks
        before the earlier ones it is resolving. Elsewhere nothing."""
        producer = self._producer
        if (
            producer is None
            or self._server is not threading.current_thread()
            or self._in_round
            or self._serving_done.is_set()
            or time.monotonic() - self._last_round < DUE_AFTER_S
            or not len(producer)
        ):
            return
        self._serve_once()

    def wait(self, fut: Future[T], timeout: float | None = None) -> T:
        """Block until ``fut`` is resolved: on the thread that serves the reports, by
        serving them (nobody else would resolve it), elsewhere a plain wait."""
        if fut.done() or self._server is not threading.current_thread():
            return fut.result(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not fut.done():
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError()
            self._serve_once(0.005)
        return fut.result()

    async def _serve(self) -> None:
        assert self._producer is not None
        kick = self._kick = asyncio.Event()
        try:
            while not self._stop.is_set():
                served = self._serve_once()
                # Read each round: a transactional producer may be replaced (_renew).
                producer = self._producer
                if len(producer):  # records in flight, or reports to hand out
                    # Reports came in: more are likely behind them (a broker answers a
                    # batch at once), so look again after one loop round, not 1 ms.
                    await asyncio.sleep(0 if served else LOOP_SERVE_S)
                    continue
                # Idle: sleep until a send kicks (see _produce). The flag is raised after
                # the clear and before the second look, so no send goes unnoticed.
                kick.clear()
                self._idle = True
                if not len(producer):
                    try:
                        await asyncio.wait_for(kick.wait(), LOOP_IDLE_S)
                    except TimeoutError:
                        pass
                self._idle = False
        finally:
            self._serving_done.set()

    def _wake(self) -> None:
        """A send while the serving loop idles: it polls again at once."""
        self._idle = False
        kick, loop = self._kick, self._loop
        if kick is None or loop is None:
            return
        try:
            loop.call_soon_threadsafe(kick.set)
        except RuntimeError:  # the loop is closed: close() serves what is left
            pass

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Future[None]:
        fut: AckFuture[None] = AckFuture()
        # A partial, not a closure: one allocation per record instead of a function and
        # its cells; the delivery report appends (err, msg).
        delivered = partial(self._delivered, key, value, fut, time.monotonic())
        with self._ordered(topic):
            self._produce(topic, value, key, partition, headers, delivered)
        return fut

    def send_all(
        self,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes | None]],
        *,
        partition: int | None = None,
        headers: Sequence[list[tuple[str, bytes]] | None] | None = None,
    ) -> Future[None]:
        """Send ``(key, value)`` records (``headers``: each record's, in order); one
        future for all of them (failed if any record failed, once every record is
        reported)."""
        fut: AckFuture[None] = AckFuture()
        if not records:
            fut.set_result(None)
            return fut
        self._check_sizes(topic, records)
        sent = time.monotonic()
        if partition is None and topic in self._hooks:
            # Keyed records of a hooked topic: the hook needs each one's partition.
            countdown = _Countdown(fut, len(records))
            with self._send_lock:
                for n, (key, value) in enumerate(records):
                    delivered = partial(self._delivered, key, value, countdown, sent)
                    extra = headers[n] if headers else None
                    self._produce(topic, value, key, partition, extra, delivered)
            return fut
        group_delivered = _Group(self, records, fut, len(records), sent).delivered
        with self._ordered(topic):
            if headers:
                for (key, value), extra in zip(records, headers, strict=True):
                    self._produce(topic, value, key, partition, extra, group_delivered)
            else:
                for key, value in records:
                    self._produce(topic, value, key, partition, None, group_delivered)
        return fut

    def _check_sizes(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes | None]]
    ) -> None:
        """Refuse a group with a record the client would refuse, before any is produced.

        The client checks ``message.max.bytes`` in ``produce()``: failing there midway
        would leave the group's first records in flight under a group that never
        completes (nothing applied to the cache, the future never resolved)."""
        limit = self._max_message_bytes
        for key, value in records:
            size = (len(key) if key else 0) + (len(value) if value else 0)
            if size > limit:
                raise RecordRefusedError(
                    f"a record of {topic} (key {(key or b'')[:80]!r}) is {size} bytes, over "
                    f"the producer's message.max.bytes ({limit})",
                    code=KafkaError.MSG_SIZE_TOO_LARGE,
                )

    def send_untracked(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes | None]], partition: int
    ) -> Future[None]:
        """Send records whose individual acks nobody waits for (emitted markers, pruning
        tombstones): only the last one carries a delivery report, and the ``on_acked``
        hook sees all of them when it arrives.

        Why: the client takes the GIL for every delivery report, and while the event loop
        is busy each one waits for a GIL switch, so reports (and the acks waiting behind
        them) queue up. One partition's records are acked in order (the producer is
        idempotent), so the last one's report stands for the group. If an earlier one
        failed while the last succeeded, the hook has applied an entry the log lacks: for
        these records that only means a marker or a tombstone is missing from the log,
        which costs a re-sent output or a leftover entry, as a lost marker or a lost
        tombstone always has.
        """
        fut: AckFuture[None] = AckFuture()
        if not records:
            fut.set_result(None)
            return fut
        group = _Group(self, records, fut, 1, time.monotonic())
        with self._ordered(topic):
            for key, value in records[:-1]:
                self._produce(topic, value, key, partition, None, None)
            key, value = records[-1]
            self._produce(topic, value, key, partition, None, group.delivered)
        return fut

    def _ordered(self, topic: str) -> AbstractContextManager[object]:
        """The send lock for a hooked topic (see :class:`_Group`), nothing otherwise."""
        return self._send_lock if topic in self._hooks else nullcontext()

    def _group_done(self, group: _Group, last: Message) -> None:
        """``group``'s last report is in: one Ack for its records; with failures, one
        that fails the future first, then the records that did reach the log (if it
        knows which: an untracked group does not, and applies none)."""
        topic, partition = last.topic(), last.partition()
        if not group.failed:
            offset, future = _offset(last), group.future
            acks = [
                Ack(topic, partition, offset, None, None, future, None, group.sent, group.records)
            ]
        else:
            error = group.failed[0][0]
            failure = Ack(topic, partition, -1, None, None, group.future, error, group.sent, ())
            acks = [failure]
            if group.expected == len(group.records):  # every record reported: known
                lost = Counter((msg.key(), msg.value()) for _, msg in group.failed)
                reached, failure.lost = [], []
                for record in group.records:
                    if lost[record] > 0:
                        lost[record] -= 1
                        failure.lost.append(record)
                    else:
                        reached.append(record)
                if reached:
                    # The failure settled the future; offset -1 moves no checkpoint
                    # (the highest reached offset is unknown here).
                    future = group.future
                    acks.append(
                        Ack(topic, partition, -1, None, None, future, None, group.sent, reached)
                    )
        with self._batch_lock:
            self._batch.extend(acks)

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        headers: list[tuple[str, bytes]] | None,
        delivered: Callable[[KafkaError | None, Message], None] | None,
    ) -> None:
        producer = self._producer  # not `or`: a Producer's len() is its queue length
        if producer is None:
            producer = self.producer
        while True:
            try:
                if partition is not None and not headers:
                    # Positional: the usual journal append skips building keyword args.
                    producer.produce(topic, value, key, partition, delivered)
                elif headers:
                    # -1: the partitioner's choice. (The fifth parameter is ``callback``,
                    # then ``on_delivery`` and ``timestamp``: headers go by keyword.)
                    where = -1 if partition is None else partition
                    producer.produce(topic, value, key, where, delivered, headers=headers)
                else:
                    producer.produce(topic, value, key, on_delivery=delivered)
                if self._idle:
                    self._wake()
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() in _REFUSED:
                    size = (len(key) if key else 0) + (len(value) if value else 0)
                    raise RecordRefusedError(
                        f"a record of {topic} (key {(key or b'')[:80]!r}, {size} bytes) was "
                        f"refused: {error.str()} (the producer's message.max.bytes is "
                        f"{self._max_message_bytes})",
                        code=error.code(),
                    ) from exc
                if isinstance(error, KafkaError) and error.code() == KafkaError._FATAL:
                    # The producer is unusable (a transactional one fenced, e.g. by its own
                    # replacement's late initialisation): the write was not taken, which
                    # is not the record's fault (host/policy.py undelivered), and the
                    # producer must be replaced (kafka/transactions.py) or the worker
                    # restarted; never an action error, never a dead letter.
                    raise KafkaIOError(
                        f"a write to {topic} was not taken: the producer is in a fatal "
                        f"state ({error.str()}; librdkafka's FATAL line says why)",
                        code=KafkaError._FATAL,
                    ) from exc
                if isinstance(error, KafkaError) and error.code() == KafkaError._STATE:
                    # A transactional producer with no transaction open (the
                    # TransactionalProducer refuses those sends itself; this is the
                    # client's word for one that raced it): not the record's fault.
                    raise KafkaIOError(
                        f"a write to {topic} was not taken: {error.str()}",
                        code=KafkaError._STATE,
                    ) from exc
                raise
            except BufferError:
                # Local queue full: let deliveries drain instead of failing the action.
                if self._serves_reports():
                    producer.poll(0.05)
                else:
                    # Only the poll thread serves delivery reports: a group completed on
                    # another thread while the poll thread dispatched a later group of
                    # its partition would move the cache checkpoint past the first.
                    time.sleep(0.005)

    def _delivered(
        self,
        key: bytes | None,
        value: bytes | None,
        fut: Future[None] | _Countdown,
        sent: float,
        err: KafkaError | None,
        msg: Message,
    ) -> None:
        ack = Ack(msg.topic(), msg.partition(), _offset(msg), key, value, fut, err, sent)
        with self._batch_lock:
            self._batch.append(ack)

    def _serves_reports(self) -> bool:
        """Whether this thread may serve delivery reports: the poll thread (or the
        serving loop's), or any thread once it is gone."""
        loop = self._loop
        thread = self._thread if loop is None else self._server
        if loop is not None and (self._serving_done.is_set() or not loop.is_running()):
            return True  # the serving loop stopped (or never ran): whoever is here
        return thread is None or not thread.is_alive() or thread is threading.current_thread()

    def _poll_loop(self) -> None:
        assert self._producer is not None
        me = threading.current_thread()
        while not self._stop.is_set() and self._thread is me:
            try:
                self._producer.poll(POLL_HURRIED_S if self._hurry else POLL_IDLE_S)
            except KafkaException:
                # A fatal producer (a transactional one fenced or refused) raises from
                # every poll; its owner is told by the call that failed, and replaces it
                # or stops. The reports it still has are dispatched below.
                time.sleep(0.05)
            self._dispatch()
            self._rounds += 1

    def _dispatch(self) -> None:
        with self._batch_lock:
            if not self._batch:
                return
            batch, self._batch = self._batch, []
        by_topic: dict[str, list[Ack]] = {}
        for ack in batch:
            if ack.error is None:
                by_topic.setdefault(ack.topic, []).append(ack)
        for topic, acks in by_topic.items():
            hook = self._hooks.get(topic)
            if hook is not None:
                try:
                    hook(acks)
                except Exception as exc:  # the cache failed: the waiters must not proceed
                    for ack in acks:
                        ack.error = KafkaError(KafkaError._FAIL, f"ack hook failed: {exc}")
        for ack in batch:
            if ack.future.done():
                continue
            if ack.error is None:
                ack.future.set_result(None)
            else:
                code = ack.error.code()
                if code in _DROPPED:
                    # Dropped by this host on purpose: a transaction it aborts (its
                    # partitions are all taken again after). The work is abandoned, not
                    # failed: never dead-lettered, run again from the committed offsets.
                    why = f"send to {ack.topic} dropped ({ack.error.str()})"
                    ack.future.set_exception(OwnershipLost("", ack.partition, why))
                    continue
                kind = RecordRefusedError if code in _REFUSED else KafkaIOError
                error = kind(f"delivery to {ack.topic} failed: {ack.error}", code=code)
                error.lost = ack.lost
                ack.future.set_exception(error)
        for observe in self._observers:
            try:
                observe(batch)
            except Exception:  # a metrics bug must not stop acks
                pass

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until every record sent is reported and dispatched (futures resolved);
        returns how many are still outstanding after ``timeout``."""
        producer = self._producer
        if producer is None:
            return 0
        if self._serves_reports():
            remaining = int(producer.flush(timeout))
            self._dispatch()
            return remaining
        # The poll thread serves the reports (see _produce): wait for it to drain the
        # queue, then for one more of its rounds, which dispatches the last reports.
        # Once nothing is in flight, a poll thread waits POLL_IDLE_S in each poll and a
        # serving loop LOOP_IDLE_S between rounds: hurried from the start (short polls
        # from the last report on) and woken, they run those rounds now. An exactly-once
        # commit flushes with every send held: the idle waits were ~100 ms of each commit.
        deadline = time.monotonic() + timeout
        self._hurry = True
        try:
            while len(producer) and time.monotonic() < deadline:
                time.sleep(0.001)
            rounds = self._rounds
            while self._rounds <= rounds + 1 and time.monotonic() < deadline:
                if not self._serves_reports():
                    self._wake()
                    time.sleep(0.001)
                else:  # the poll thread stopped meanwhile
                    self._dispatch()
                    break
        finally:
            self._hurry = False
        return len(producer)

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._loop is not None and self._server is not None:
            started = self._producer is not None
            if started and threading.current_thread() is not self._server:
                self._serving_done.wait(timeout=1)  # its round in progress, then it stops
        self._dispatch()
