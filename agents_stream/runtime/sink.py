"""Output sink of the worker: an agent's OutputEvents to its output topic."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from ..kafka.producer import AckingProducer


class KafkaOutputSink:
    # The runner may call send from the producer's thread (chained on an ActionDone ack):
    # producing is thread-safe and the codecs keep no per-call state.
    threadsafe = True

    def __init__(self, producer: AckingProducer, topic: str, codec: Any) -> None:
        self._producer = producer
        self._topic = topic
        self._codec = codec

    def send(self, key: str, values: Sequence[Any], partition: int) -> Future[None]:
        # The output keeps the input key; its partition follows from the key.
        raw_key, encode = key.encode(), self._codec.encode
        return self._producer.send_all(self._topic, [(raw_key, encode(v)) for v in values])

    def send_batch(self, outputs: Sequence[tuple[str, Sequence[Any]]]) -> Future[None]:
        """Outputs of many keys (a batch's finished actions), one future for all."""
        encode = self._codec.encode
        return self._producer.send_all(
            self._topic, [(key.encode(), encode(v)) for key, values in outputs for v in values]
        )
