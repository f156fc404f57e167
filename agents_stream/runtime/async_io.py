"""AsyncIOHost: runs one ``app.async_io(...)`` binding inside the worker.

The worker hands every record of the binding's input topic to :meth:`AsyncIOHost.handle`
(through the execution controller, one task per record); the record's offset becomes
committable when that coroutine returns. The host feeds an
:class:`~agents_stream.aio.AsyncWaitOperator` and turns its callbacks into Kafka writes.

Per record, in order:

1. decode the value (JSON); undecodable -> ``<input>-dlq`` (stage ``decode``), done;
2. admit it to the operator in arrival order (waits while ``capacity`` elements are in
   flight: that wait keeps the record unfinished, so the worker's in-flight limit
   pauses the partitions); in event time, feed the watermark generator and queue the
   watermark behind the record when it advances;
3. the operator calls ``emit`` (results) or ``fail`` (exception, timeout included) when
   the element's turn comes; ``emit`` produces every output to ``binding.output`` with
   the input key, ``fail`` copies the input to ``<input>-dlq`` (stage ``async_io``);
   both produce synchronously, so outputs enter the producer in the operator's order;
4. ``handle`` waits for the broker's acks of those writes and returns: outputs are
   durable before the input can be committed.

Guarantees:
    * No loss: an input is committed only after its outputs (or dead letter) were
      acknowledged, and never while an earlier input of its partition is unfinished.
    * At least once, not exactly once: a crash (or a revoke that abandons records)
      after outputs were acknowledged but before the offset commit re-invokes ``fn``
      for those inputs on the next owner and writes their outputs again.
    * Order: with ``ordered=True`` outputs leave in arrival order, hence in offset order
      per input partition (duplicates after a crash repeat a suffix). Unordered outputs
      leave as completed; in event time never across a watermark.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Message

from ..aio import AsyncWaitOperator, Element, OperatorClosedError
from ..app import AsyncIOBinding
from ..durable.output_identity import OUTPUT_HEADER
from ..durable.store import all_of
from ..host.dlq import DeadLetters
from ..kafka.producer import AckingProducer
from ..serde.values import ValueCodec, value_codec
from .watermarks import WatermarkGenerator, monotonic_ms

log = logging.getLogger("agents_stream.async_io")

# What an element's settle future carries: the acks of the writes its callback made.
Acks = Future[None]


class AsyncIOHost:
    """Hosts one Async I/O binding on the worker's event loop.

    Args:
        binding: The ``app.async_io`` declaration.
        producer: Shared worker producer (outputs and dead letters).
        dlq: Dead-letter writer of the worker.
        out_of_orderness_ms: Event time only: allowed lateness of a timestamp behind its
            partition's newest one (Flink's bounded out-of-orderness).
        idle_timeout_ms: Event time only: a partition without records this long stops
            holding the watermark back; None disables idleness.
        watermark_interval: Event time only: seconds between idleness checks (Flink's
            auto-watermark interval).
        origin: the app id, first field of each output's identity header (none if "").

    Construction does no I/O; the operator is created on the first ``handle`` so it
    binds to the running loop.
    """

    def __init__(
        self,
        binding: AsyncIOBinding,
        producer: AckingProducer,
        dlq: DeadLetters,
        *,
        out_of_orderness_ms: int = 200,
        idle_timeout_ms: int | None = 10_000,
        watermark_interval: float = 0.2,
        origin: str = "",
    ) -> None:
        self.binding = binding
        self._origin = origin
        self._producer = producer
        self._dlq = dlq
        self._codec: ValueCodec = value_codec(None)
        self._out_of_orderness_ms = out_of_orderness_ms
        self._idle_timeout_ms = idle_timeout_ms
        self._watermark_interval = watermark_interval
        self._op: AsyncWaitOperator | None = None
        self._watermarks: WatermarkGenerator | None = None
        self._idle_task: asyncio.Task[None] | None = None
        # FIFO admission: the operator's own capacity wait can let a newcomer overtake
        # a woken waiter, which would reorder ordered output. asyncio.Lock is fair.
        self._admission: asyncio.Lock | None = None
        # id(element) -> future settled by emit/fail with the acks of its writes.
        self._settle: dict[int, asyncio.Future[Acks]] = {}
        self.watermark: int | None = None  # last watermark the operator delivered
        self.stats: Counter[str] = Counter()

    # -- worker interface --------------------------------------------------------------

    async def handle(self, msg: Message) -> None:
        """Processes one input record; returns once its outputs are acknowledged.

        Raises:
            asyncio.CancelledError: The host was aborted or closed before the record
                settled; it is not committed and will be processed again.
            KafkaIOError: An output or dead letter was not acknowledged; the record
                stays uncommitted.
        """
        try:
            value = self._codec.decode(msg.value())
        except Exception as exc:
            log.warning(
                "undecodable record %s[%d]@%d -> %s-dlq: %s",
                msg.topic(), msg.partition(), msg.offset(), msg.topic(), exc,
            )  # fmt: skip
            self.stats["dlq"] += 1
            await asyncio.wrap_future(self._dlq.send(msg, "decode", exc))
            return
        ts = msg.timestamp()[1]
        element = Element(value, timestamp=ts if ts >= 0 else None, token=msg)
        settled: asyncio.Future[Acks] = asyncio.get_running_loop().create_future()
        try:
            await self._admit(element, msg.partition(), settled)
            acks = await settled
        except OperatorClosedError:
            # Closed or aborted under us: the record is simply unfinished (not an
            # error); surfacing it as cancellation keeps the worker log quiet.
            raise asyncio.CancelledError from None
        finally:
            self._settle.pop(id(element), None)
        await asyncio.wrap_future(acks)

    async def close(self, timeout: float | None = None) -> None:
        """Graceful stop: admits nothing more and delivers everything in flight.

        Retries waiting for their backoff fire at once and are final (Flink end of
        input). Records not admitted yet end as cancelled (uncommitted). Call it before
        or while the worker drains its controller, so in-flight records can finish.

        Raises:
            TimeoutError: ``timeout`` passed; what is left stays unsettled (``abort``).
        """
        self._stop_idle_checks()
        if self._op is not None:
            await self._op.drain(timeout)

    def abort(self) -> int:
        """Crash-like stop for revokes: drops every in-flight element undelivered.

        Every waiting ``handle`` ends cancelled, so none of those records is committed;
        their new owner (or this worker, later) processes them again. The next
        ``handle`` starts a fresh operator and fresh watermark state.

        Returns:
            How many admitted elements were dropped.
        """
        self._stop_idle_checks()
        dropped = self._op.abort() if self._op is not None else []
        self._op = None
        self._watermarks = None
        for settled in self._settle.values():
            settled.cancel()  # its handle ends cancelled: uncommitted, not an error
        return len(dropped)

    def forget_partitions(self, partitions: Iterable[int]) -> None:
        """Event time: revoked partitions stop holding the watermark back.

        Call on the event loop after a revoke; their unfinished records are the
        controller's to abandon (their late outputs are dropped, see ``_waiting``).
        """
        if self._watermarks is not None:
            for partition in partitions:
                self._watermarks.forget(partition)

    @property
    def pending(self) -> int:
        """Records admitted to the operator and not settled yet."""
        return len(self._op.pending()) if self._op is not None else 0

    # -- admission ---------------------------------------------------------------------

    async def _admit(self, element: Element, partition: int, settled: asyncio.Future[Acks]) -> None:
        if self._admission is None:
            self._admission = asyncio.Lock()
        async with self._admission:
            op = self._operator()
            # Registered only now, so an abort() does not fail records still queued for
            # admission: they go to the next operator instead.
            self._settle[id(element)] = settled
            await op.process(element)
            if self._watermarks is not None and element.timestamp is not None:
                watermark = self._watermarks.on_record(partition, element.timestamp)
                if watermark is not None:
                    await op.process_watermark(watermark)

    def _operator(self) -> AsyncWaitOperator:
        if self._op is None:
            b = self.binding
            self._op = AsyncWaitOperator(
                b.fn,
                ordered=b.ordered,
                time_mode=b.time_mode,
                capacity=b.capacity,
                timeout=b.timeout,
                retry=b.retry,
                on_timeout=b.on_timeout,
                emit=self._emit,
                fail=self._fail,
                emit_watermark=self._on_watermark,
            )
            if b.time_mode == "event":
                self._watermarks = WatermarkGenerator(
                    self._out_of_orderness_ms, self._idle_timeout_ms
                )
                if self._idle_timeout_ms is not None:
                    self._idle_task = asyncio.get_running_loop().create_task(
                        self._idle_checks(self._op, self._watermarks)
                    )
        return self._op

    async def _idle_checks(self, op: AsyncWaitOperator, generator: WatermarkGenerator) -> None:
        """Advances the watermark when a lagging partition turns idle (no records)."""
        assert self._admission is not None
        while True:
            await asyncio.sleep(self._watermark_interval)
            # Under the admission lock: a record's watermark computed concurrently could
            # otherwise be queued after this one and go back in time.
            async with self._admission:
                watermark = generator.on_idle_check(monotonic_ms())
                if watermark is None:
                    continue
                try:
                    await op.process_watermark(watermark)
                except OperatorClosedError:
                    return

    def _stop_idle_checks(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None

    # -- operator callbacks (never raise: a raising callback stops the operator) -------

    def _emit(self, element: Element, outputs: list[Any]) -> None:
        settled = self._waiting(element)
        if settled is None:
            return
        msg: Message = element.token
        try:
            payloads = [self._codec.encode(output) for output in outputs]
        except Exception as exc:
            # fn returned something the output codec cannot write: a bad result for
            # this record only, so it is dead-lettered like a failure.
            self._fail(element, exc)
            return
        try:
            headers = self._identities(msg, len(payloads))
            acks = all_of(
                [
                    self._producer.send(self.binding.output, p, key=msg.key(), headers=h)
                    for p, h in zip(payloads, headers, strict=True)
                ]
            )
        except Exception as exc:
            settled.set_exception(exc)
            return
        self.stats["emitted"] += len(payloads)
        settled.set_result(acks)

    def _identities(self, msg: Message, count: int) -> list[list[tuple[str, bytes]] | None]:
        """Each output's ``x-agents-stream-output`` header. Nothing is journaled here, so
        the identity holds the input record's timestamp where an action's holds when it
        finished: every run over the same input record gives the same identities, and a
        consumer that dedupes on them drops what a re-run after a crash sends again."""
        if not self._origin:
            return [None] * count
        stamp = msg.timestamp()[1]
        head = (
            f"{self._origin}/{msg.topic()}/{msg.partition()}/{msg.offset()}/"
            f"async_io:{self.binding.name}/{stamp}/"
        )
        return [[(OUTPUT_HEADER, f"{head}{j}".encode())] for j in range(count)]

    def _fail(self, element: Element, exc: BaseException) -> None:
        settled = self._waiting(element)
        if settled is None:
            return
        msg: Message = element.token
        log.warning(
            "async I/O %s failed on %s[%d]@%d -> %s-dlq: %r",
            self.binding.name, msg.topic(), msg.partition(), msg.offset(), msg.topic(), exc,
        )  # fmt: skip
        self.stats["dlq"] += 1
        try:
            settled.set_result(self._dlq.send(msg, "async_io", exc))
        except Exception as send_exc:
            settled.set_exception(send_exc)

    def _waiting(self, element: Element) -> asyncio.Future[Acks] | None:
        """The settle future of ``element``, or None if its ``handle`` is gone.

        A handle cancelled by a revoke or shutdown left its record uncommitted; writing
        its outputs now would only add a duplicate to what the next owner writes.
        """
        settled = self._settle.get(id(element))
        if settled is None or settled.done():
            self.stats["dropped"] += 1
            return None
        return settled

    def _on_watermark(self, timestamp: int) -> None:
        # Kafka topics carry no watermarks; the host only records event-time progress.
        self.watermark = timestamp
