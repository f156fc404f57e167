"""Output sink of the worker: an agent's OutputEvents to its output topic."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from ..durable.ackfuture import AckFuture
from ..durable.store import completed_future
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
        payload codec, if the caller has them."""
        # The output keeps the input key; its partition follows from the key.
        raw_key = key.encode()
        return self._producer.send_all(
            self._topic, [(raw_key, p) for p in self._payloads(values, stored)]
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
        failed: dict[int, KafkaIOError] = {}
        futures: list[Future[None]] = []
        for position, (raw_key, payloads) in enumerate(records):
            try:
                futures.append(
                    self._producer.send_all(self._topic, [(raw_key, p) for p in payloads])
                )
            except RecordRefusedError as exc:
                failed[position] = exc
                futures.append(completed_future())
        combined: Future[None] = AckFuture()
        left = [len(futures)]
        lock = threading.Lock()

        def one_done(position: int, fut: Future[None]) -> None:
            exc = fut.exception()
            with lock:
                if isinstance(exc, KafkaIOError):
                    failed[position] = exc
                elif exc is not None:
                    failed[position] = KafkaIOError(str(exc))
                left[0] -= 1
                if left[0]:
                    return
            if failed:
                combined.set_exception(PartialSendError(failed))
            else:
                combined.set_result(None)

        for position, fut in enumerate(futures):
            fut.add_done_callback(partial(one_done, position))
        return combined

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
    """``sent``, failing with the records whose outputs did not all reach the log."""
    out: Future[None] = AckFuture()

    def settle(fut: Future[None]) -> None:
        exc = fut.exception()
        if exc is None:
            out.set_result(None)
            return
        if not isinstance(exc, KafkaIOError) or exc.lost is None:
            out.set_exception(exc)  # which records are at fault is unknown: all of them
            return
        lost = Counter(exc.lost)
        failed: dict[int, KafkaIOError] = {}
        for position, (raw_key, payloads) in enumerate(records):
            for payload in payloads:
                if lost[(raw_key, payload)] > 0:
                    lost[(raw_key, payload)] -= 1
                    failed[position] = exc
        out.set_exception(PartialSendError(failed) if failed else exc)

    sent.add_done_callback(settle)
    return out
