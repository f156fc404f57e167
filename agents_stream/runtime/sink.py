"""Output sink of the worker: an agent's OutputEvents to its output topic."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from ..durable.values import plain_json
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
        """Outputs of many keys (a batch's finished actions; key, values, ``stored`` as
        for :meth:`send`), one future for all."""
        return self._producer.send_all(
            self._topic,
            [
                (raw_key, p)
                for key, values, stored in outputs
                for raw_key in (key.encode(),)
                for p in self._payloads(values, stored)
            ],
        )

    def _payloads(self, values: Sequence[Any], stored: Sequence[bytes] | None) -> list[bytes]:
        encode = self._codec.encode
        if stored is None or not self._reuse:
            return [encode(v) for v in values]
        out = []
        for value, data in zip(values, stored, strict=True):
            raw = plain_json(data)
            out.append(encode(value) if raw is None else raw)
        return out
