"""Dead letters: a record that cannot be processed goes to ``<topic>-dlq`` untouched, with
why in its headers, so nothing is lost and the worker keeps going."""

from __future__ import annotations

import time
import traceback
from concurrent.futures import Future

from confluent_kafka import Message

from ..kafka.producer import AckingProducer


class DeadLetters:
    def __init__(self, producer: AckingProducer, app_id: str) -> None:
        self._producer = producer
        self._app_id = app_id

    def send(self, msg: Message, stage: str, exc: BaseException) -> Future[None]:
        """Copy ``msg`` (key, value, headers) to its DLQ; stage is "decode" or "action"."""
        headers = list(msg.headers() or [])
        headers += [
            ("x-error-stage", stage.encode()),
            ("x-error-type", f"{type(exc).__module__}.{type(exc).__qualname__}".encode()),
            ("x-error-message", str(exc).encode()[:4000]),
            ("x-error-traceback", "".join(traceback.format_exception(exc)).encode()[-8000:]),
            ("x-source-topic", msg.topic().encode()),
            ("x-source-partition", str(msg.partition()).encode()),
            ("x-source-offset", str(msg.offset()).encode()),
            ("x-app-id", self._app_id.encode()),
            ("x-failed-at-ms", str(int(time.time() * 1000)).encode()),
        ]
        return self._producer.send(
            f"{msg.topic()}-dlq", msg.value(), key=msg.key(), headers=headers
        )
