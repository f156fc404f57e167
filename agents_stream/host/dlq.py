"""Dead letters: a record that cannot be processed goes to ``<topic>-dlq`` untouched, with
why in its headers, so nothing is lost and the worker keeps going.

Replay (``agents-stream dlq replay``) produces a dead letter back to its input partition
with ``x-replay-of: <topic>/<partition>/<offset>``, the record's original position.
Hosts run a replayed record under that original identity (:func:`original_identity`), so
it meets the ActionStates its first attempt journaled: calls that completed are replayed,
not executed again. Hosts keep the journal of dead-lettered and replayed records (no
pruning) for the same reason.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Mapping
from concurrent.futures import Future

from confluent_kafka import Message

from .. import tracing
from ..kafka.producer import AckingProducer

REPLAY_HEADER = "x-replay-of"
# Headers a dead letter gains; a replay strips them so the record reads like the original.
DLQ_HEADERS = frozenset(
    {
        "x-error-stage",
        "x-error-type",
        "x-error-message",
        "x-error-traceback",
        "x-source-topic",
        "x-source-partition",
        "x-source-offset",
        "x-app-id",
        "x-failed-at-ms",
        REPLAY_HEADER,
    }
)

Headers = Mapping[str, bytes | None] | Iterable[tuple[str, bytes | None]] | None


def replay_header(topic: str, partition: int, offset: int) -> tuple[str, bytes]:
    return REPLAY_HEADER, f"{topic}/{partition}/{offset}".encode()


def replay_of(headers: Headers) -> tuple[str, int, int] | None:
    """``(topic, partition, offset)`` from an ``x-replay-of`` header, else None (also when
    malformed: a header anyone can write must not stop a worker)."""
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in items:
        if name != REPLAY_HEADER or value is None:
            continue
        topic, _, rest = value.decode("utf-8", "replace").partition("/")
        partition, _, offset = rest.partition("/")
        try:
            return topic, int(partition), int(offset)
        except ValueError:
            return None
    return None


def original_identity(headers: Headers, topic: str | None = None) -> tuple[int, int] | None:
    """``(partition, offset)`` of the record a replayed record stands for, or None.

    With ``topic``, a replay of another topic's record is not an identity here (None).
    """
    found = replay_of(headers)
    if found is None or (topic is not None and found[0] != topic):
        return None
    return found[1], found[2]


class DeadLetters:
    def __init__(self, producer: AckingProducer, app_id: str) -> None:
        self._producer = producer
        self._app_id = app_id

    def send(self, msg: Message, stage: str, exc: BaseException) -> Future[None]:
        """Copy ``msg`` (key, value, headers) to its DLQ; stage is "decode" or "action"."""
        headers = list(msg.headers() or [])
        traces = tracing.CURRENT
        if traces is not None:  # the failed run's span: a replay continues its trace
            ours = traces.headers_for(msg.topic(), msg.partition(), msg.offset())
            if ours:
                names = {name for name, _ in ours}
                headers = [h for h in headers if h[0] not in names] + ours
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
