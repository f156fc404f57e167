"""AckingProducer: produce with linger and hand back a future per record.

One background thread polls librdkafka for delivery reports. Reports are gathered per
poll and handed to ``on_acked`` hooks *before* the futures resolve, so a hook (the RocksDB
cache) can apply a whole poll's worth of acks in one write batch and a waiter never
observes an acked record that the cache does not have yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from ..durable.ackfuture import AckFuture
from ..errors import KafkaIOError

AckHook = Callable[[list["Ack"]], None]


@dataclass
class Ack:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    future: Future[None] | _Countdown
    error: KafkaError | None = None
    sent: float = 0.0  # time.monotonic() at produce


class _Countdown:
    """Stands in for the future of each record of a group sent by
    :meth:`AckingProducer.send_all`: the group's one future resolves when the last of
    them is acked, or with the first failure. Only the poll thread's ``_dispatch``
    resolves acks, so it needs no lock (a future and a callback per record did)."""

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


class AckingProducer:
    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._producer: Producer | None = None
        self._hooks: dict[str, AckHook] = {}
        self._batch: list[Ack] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._batch_lock = threading.Lock()
        self._observers: list[AckHook] = []

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
                self._thread = threading.Thread(
                    target=self._poll_loop, name="agents-stream-producer", daemon=True
                )
                self._thread.start()
            return self._producer

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
        self._produce(topic, value, key, partition, headers, delivered)
        return fut

    def send_all(
        self,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes | None]],
        *,
        partition: int | None = None,
    ) -> Future[None]:
        """Send ``(key, value)`` records; one future for all of them (first error wins)."""
        fut: AckFuture[None] = AckFuture()
        if not records:
            fut.set_result(None)
            return fut
        group, sent = _Countdown(fut, len(records)), time.monotonic()
        for key, value in records:
            delivered = partial(self._delivered, key, value, group, sent)
            self._produce(topic, value, key, partition, None, delivered)
        return fut

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
        sent = time.monotonic()
        for key, value in records[:-1]:
            self._produce(topic, value, key, partition, None, None)
        delivered = partial(self._delivered_group, records, fut, sent)
        key, value = records[-1]
        self._produce(topic, value, key, partition, None, delivered)
        return fut

    def _delivered_group(
        self,
        records: Sequence[tuple[bytes | None, bytes | None]],
        fut: AckFuture[None],
        sent: float,
        err: KafkaError | None,
        msg: Message,
    ) -> None:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        group = _Countdown(fut, len(records))
        # The earlier records' offsets are below the last one's: the hook only uses the
        # highest (the cache checkpoint).
        acks = [Ack(topic, partition, offset, k, v, group, err, sent) for k, v in records]
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
                    kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": delivered}
                    if partition is not None:
                        kwargs["partition"] = partition
                    kwargs["headers"] = headers
                    producer.produce(topic, **kwargs)
                else:
                    producer.produce(topic, value, key, on_delivery=delivered)
                return
            except BufferError:
                # Local queue full: let deliveries drain instead of failing the action.
                producer.poll(0.05)

    def _delivered(
        self,
        key: bytes | None,
        value: bytes | None,
        fut: Future[None] | _Countdown,
        sent: float,
        err: KafkaError | None,
        msg: Message,
    ) -> None:
        ack = Ack(msg.topic(), msg.partition(), msg.offset(), key, value, fut, err, sent)
        with self._batch_lock:
            self._batch.append(ack)

    def _poll_loop(self) -> None:
        assert self._producer is not None
        while not self._stop.is_set():
            self._producer.poll(0.05)
            self._dispatch()

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
                ack.future.set_exception(
                    KafkaIOError(
                        f"delivery to {ack.topic} failed: {ack.error}", code=ack.error.code()
                    )
                )
        for observe in self._observers:
            try:
                observe(batch)
            except Exception:  # a metrics bug must not stop acks
                pass

    def flush(self, timeout: float = 30.0) -> int:
        if self._producer is None:
            return 0
        remaining = self._producer.flush(timeout)
        return int(remaining)

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._dispatch()
