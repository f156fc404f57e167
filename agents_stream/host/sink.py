"""Output sink of the worker: an agent's OutputEvents to its output topic."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from .. import tracing
from ..ackfuture import AckFuture
from ..durable.journal import ActionDone
from ..durable.output_identity import OUTPUT_HEADER, output_prefix
from ..durable.ownership import Ownership
from ..durable.sink import Sink, SinkItem, each_sent
from ..durable.values import plain_json
from ..errors import KafkaIOError, PartialSendError, RecordRefusedError
from ..kafka.producer import AckingProducer
from ..serde.values import JsonValueCodec
from .output_log import OutputLog

# One input record's outputs as sent: key, encoded values, each value's headers.
_Record = tuple[bytes, list[bytes], list[list[tuple[str, bytes]]] | None]


class KafkaOutputSink(Sink):
    """An agent's outputs to its output topic, each with its identity in a header
    (``x-agents-stream-output``, see ``host/output_log.py``); with an ``output_log``
    it also answers which outputs of an action are in the topic already."""

    # The runner may call send from the producer's thread (chained on an ActionDone ack):
    # producing is thread-safe and the codecs keep no per-call state.
    threadsafe = True
    takes_stored = True  # see OutputSink

    def __init__(
        self,
        producer: AckingProducer,
        topic: str,
        codec: Any,
        *,
        origin: str = "",
        output_log: OutputLog | None = None,
        ownership: Ownership | None = None,
    ) -> None:
        self._producer = producer
        # No output for an input partition this member does not hold (ownership.py).
        self.ownership = ownership
        self._topic = topic
        self._codec = codec
        self._origin = origin
        self.output_log = output_log
        # A window of 0 turns the lookup off: then nothing is ever found.
        self.finds_outputs = output_log is not None and output_log.window_ms > 0
        # The default topic codec writes what the journal already holds for a plain
        # value: take those bytes rather than encode the value twice.
        self._reuse = type(codec) is JsonValueCodec

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
        *,
        done: ActionDone | None = None,
        indexes: Sequence[int] | None = None,
    ) -> Future[None]:
        """``stored``: the same values as their ActionDone journals them with the JSON
        payload codec, if the caller has them; ``done`` and ``indexes``: the ActionDone
        whose outputs these are and their indexes among them (default: 0, 1, ...), for
        their identity headers. A failure that names the lost records is a
        :class:`PartialSendError` at position 0 (``landed``: the outputs in the log)."""
        if self.ownership is not None:
            self.ownership.check_partition(partition, "output")
        # The output keeps the input key; its partition follows from the key.
        record = self._record(key, values, stored, done, indexes)
        return self._resend_refused(_blamed(self._send(record), [record]), [record])

    def send_batch(self, outputs: Sequence[SinkItem]) -> Future[None]:
        """Outputs of many input records (a batch's finished actions; key, values,
        ``stored`` and, optionally, ``done`` as for :meth:`send`), one future for all. A failure names
        the records at fault (:class:`PartialSendError`): every output of the others is
        durable, so they are finished rather than failed with them (a replay would send
        them again)."""
        ownership = self.ownership
        if ownership is not None:  # a batch is one partition's: one check, nearly always
            for partition in {o.partition for o in outputs}:
                ownership.check_partition(partition, "output")
        records = [self._record(o.key, o.values, o.stored, o.done, None) for o in outputs]
        flat = [(raw_key, p) for raw_key, payloads, _ in records for p in payloads]
        headers: list[list[tuple[str, bytes]] | None] | None = None
        if any(each for _, _, each in records):
            none: list[list[tuple[str, bytes]] | None] = [None]  # a record without any
            headers = [h for _, out, each in records for h in (each or none * len(out))]
        try:
            sent = self._producer.send_all(self._topic, flat, headers=headers)
        except RecordRefusedError:
            # Refused before anything was produced (one output over message.max.bytes):
            # each record's outputs on their own, right away, in the same order.
            return self._one_by_one(records)
        return self._resend_refused(_blamed(sent, records), records)

    def _resend_refused(self, blamed: Future[None], records: list[_Record]) -> Future[None]:
        """``blamed``, with the outputs the broker refused sent again, record by record,
        each once the previous one is settled.

        Why: a topic's ``max.message.bytes`` bounds a record *batch*, and the producer
        batches whatever goes to a partition at once: the broker refuses every output
        that shared a batch with one too large, from this send or another. Sent again
        one record at a time, only the record whose output is too large fails again
        (and is dead-lettered), not its neighbours. The price, only in this case: a
        neighbour's outputs may follow those of its key's next record, sent meanwhile
        (see docs/architecture.md, step 4)."""
        out: Future[None] = AckFuture()

        def settle(fut: Future[None]) -> None:
            exc = fut.exception()
            if exc is None:
                out.set_result(None)
                return
            if not isinstance(exc, PartialSendError) or not all(
                isinstance(e, RecordRefusedError) for e in exc.failed.values()
            ):
                out.set_exception(exc)
                return
            retries = []
            for position in sorted(exc.failed):
                raw_key, payloads, headers = records[position]
                landed = set(exc.landed.get(position, ()))
                left = [i for i in range(len(payloads)) if i not in landed]
                again: _Record = (
                    raw_key,
                    [payloads[i] for i in left],
                    [headers[i] for i in left] if headers else None,
                )
                retries.append((position, landed, left, again))
            _Retries(self, out, retries).next()

        blamed.add_done_callback(settle)
        return out

    def landed(self, done: ActionDone, indexes: Sequence[int]) -> list[int]:
        """Those of ``indexes`` whose output of ``done`` is in the topic already
        (blocking; [] without an output log)."""
        if self.output_log is None:
            return []
        return self.output_log.landed(done, indexes)

    def _record(
        self,
        key: str,
        values: Sequence[Any],
        stored: Sequence[bytes] | None,
        done: ActionDone | None,
        indexes: Sequence[int] | None,
    ) -> _Record:
        payloads = self._payloads(values, stored)
        traces = tracing.CURRENT
        trace = []
        if traces is not None and done is not None:  # the record's span (tracing.py)
            trace = traces.headers_for(done.ref.topic, done.ref.partition, done.ref.seq)
        if done is None or not self._origin:
            return key.encode(), payloads, [list(trace) for _ in payloads] if trace else None
        prefix = output_prefix(self._origin, done)
        numbers = range(len(payloads)) if indexes is None else indexes
        headers = [[(OUTPUT_HEADER, f"{prefix}{j}".encode()), *trace] for j in numbers]
        return key.encode(), payloads, headers

    def _send(self, record: _Record) -> Future[None]:
        raw_key, payloads, headers = record
        return self._producer.send_all(
            self._topic, [(raw_key, p) for p in payloads], headers=headers
        )

    def _one_by_one(self, records: list[_Record]) -> Future[None]:
        sends: list[Future[None]] = []
        for record in records:
            try:
                sent = self._send(record)
            except RecordRefusedError as exc:  # refused before any of them was produced
                sent = AckFuture()
                sent.set_exception(exc)
            sends.append(_blamed(sent, [record]))
        return each_sent(sends)

    def _payloads(self, values: Sequence[Any], stored: Sequence[bytes] | None) -> list[bytes]:
        encode = self._codec.encode
        if stored is None or not self._reuse:
            return [encode(v) for v in values]
        out = []
        for value, data in zip(values, stored, strict=True):
            raw = plain_json(data)
            out.append(encode(value) if raw is None else raw)
        return out


class _Retries:
    """The serial retries of :meth:`KafkaOutputSink._resend_refused`: each record's
    outputs sent once the previous record's are settled; ``out`` settles with the last,
    failing with the records refused again (their outputs in the log, by their original
    indexes) or succeeding."""

    def __init__(
        self,
        sink: KafkaOutputSink,
        out: Future[None],
        retries: list[tuple[int, set[int], list[int], _Record]],
    ) -> None:
        self.sink, self.out, self.retries = sink, out, retries
        self.failed: dict[int, Exception] = {}
        self.landed: dict[int, tuple[int, ...]] = {}

    def next(self) -> None:
        if not self.retries:
            if self.failed:
                self.out.set_exception(PartialSendError(self.failed, self.landed))
            else:
                self.out.set_result(None)
            return
        position, before, sent, record = self.retries.pop(0)
        try:
            fut = _blamed(self.sink._send(record), [record])
        except RecordRefusedError as err:
            fut = AckFuture()
            fut.set_exception(err)
        fut.add_done_callback(partial(self._settled, position, before, sent))

    def _settled(self, position: int, before: set[int], sent: list[int], fut: Future[None]) -> None:
        exc = fut.exception()
        if exc is not None:
            if isinstance(exc, PartialSendError):
                self.failed[position] = exc.failed[0]
            elif isinstance(exc, Exception):
                self.failed[position] = exc
            else:  # cancelled: the send's outcome is unknown
                self.failed[position] = KafkaIOError(f"output send {type(exc).__name__}")
            now = exc.landed.get(0, ()) if isinstance(exc, PartialSendError) else ()
            reached = sorted(before | {sent[i] for i in now})
            if reached:
                self.landed[position] = tuple(reached)
        self.next()


def _blamed(sent: Future[None], records: list[_Record]) -> Future[None]:
    """``sent``, failing with the records whose outputs did not all reach the log, and
    which of their outputs did (:class:`PartialSendError`)."""
    out: Future[None] = AckFuture()

    def settle(fut: Future[None]) -> None:
        exc = fut.exception()
        if exc is None:
            out.set_result(None)
            return
        if not isinstance(exc, KafkaIOError) or exc.lost is None:
            out.set_exception(exc)  # which records are at fault is unknown: all of them
            return
        # Equal (key, value) pairs are interchangeable: the keys of one send's records
        # differ, so equal pairs are outputs of one record, and which of them is counted
        # as lost changes neither what is resent nor its bytes.
        lost = Counter(exc.lost)
        failed: dict[int, Exception] = {}
        landed: dict[int, tuple[int, ...]] = {}
        for position, (raw_key, payloads, _) in enumerate(records):
            kept = []
            for index, payload in enumerate(payloads):
                if lost[(raw_key, payload)] > 0:
                    lost[(raw_key, payload)] -= 1
                    failed[position] = exc
                else:
                    kept.append(index)
            if position in failed and kept:
                landed[position] = tuple(kept)
        out.set_exception(PartialSendError(failed, landed) if failed else exc)

    sent.add_done_callback(settle)
    return out
