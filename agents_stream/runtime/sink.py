"""Output sink of the worker: an agent's OutputEvents to its output topic."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from ..durable.ackfuture import AckFuture
from ..durable.runner import each_sent
from ..durable.values import plain_json
from ..errors import KafkaIOError, PartialSendError, RecordRefusedError
from ..kafka.producer import AckingProducer
from ..serde.values import JsonValueCodec


class KafkaOutputSink:
    # The runner may call send from the producer's thread (chained on an ActionDone ack):
    # producing is thread-safe and the codecs keep no per-call state.
    threadsafe = True
    takes_stored = True  # see OutputSink

    def __init__(self, producer: AckingProducer, topic: str, codec: Any) -> None:
        self._producer = producer
        self._topic = topic
        self._codec = codec
        # The default topic codec writes what the journal already holds for a plain
        # value: take those bytes rather than encode the value twice.
        self._reuse = type(codec) is JsonValueCodec

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
    ) -> Future[None]:
        """``stored``: the same values as their ActionDone journals them with the JSON
        payload codec, if the caller has them. A failure that names the lost records is
        a :class:`PartialSendError` at position 0 (``landed``: the outputs in the log)."""
        # The output keeps the input key; its partition follows from the key.
        record = (key.encode(), self._payloads(values, stored))
        return _blamed(
            self._producer.send_all(self._topic, [(record[0], p) for p in record[1]]), [record]
        )

    def send_batch(
        self, outputs: Sequence[tuple[str, Sequence[Any], Sequence[bytes] | None]]
    ) -> Future[None]:
        """Outputs of many input records (a batch's finished actions; key, values,
        ``stored`` as for :meth:`send`), one future for all. A failure names the records
        at fault (:class:`PartialSendError`): every output of the others is durable, so
        they are finished rather than failed with them (a replay would send them again)."""
        records = [
            (key.encode(), self._payloads(values, stored)) for key, values, stored in outputs
        ]
        flat = [(raw_key, p) for raw_key, payloads in records for p in payloads]
        try:
            sent = self._producer.send_all(self._topic, flat)
        except RecordRefusedError:
            # Refused before anything was produced (one output over message.max.bytes):
            # each record's outputs on their own, right away, in the same order.
            return self._one_by_one(records)
        return _blamed(sent, records)

    def _one_by_one(self, records: list[tuple[bytes, list[bytes]]]) -> Future[None]:
        sends: list[Future[None]] = []
        for raw_key, payloads in records:
            try:
                sent = self._producer.send_all(self._topic, [(raw_key, p) for p in payloads])
            except RecordRefusedError as exc:  # refused before any of them was produced
                sent = AckFuture()
                sent.set_exception(exc)
            sends.append(_blamed(sent, [(raw_key, payloads)]))
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


def _blamed(sent: Future[None], records: list[tuple[bytes, list[bytes]]]) -> Future[None]:
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
        failed: dict[int, KafkaIOError] = {}
        landed: dict[int, tuple[int, ...]] = {}
        for position, (raw_key, payloads) in enumerate(records):
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
