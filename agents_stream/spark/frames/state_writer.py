"""Appends journal entries (or tombstones) to an ActionState topic from outside a worker.

Used by ``spark reconcile`` (terminal CallResults for PENDING slots) and by ``spark
backfill --write-journal``. Records are written exactly as the worker's store writes them:
Kafka key :func:`~agents_stream.durable.keys.entry_key_bytes`, value from the journal codec
(``None`` for a tombstone), to an explicit partition (the ActionState partition equals
the input partition, so the caller names it; the key's hash is *not* used).

The producer is idempotent with ``acks=all``; :meth:`ActionStateWriter.flush` returns only
when every record was acknowledged and raises if any failed, so a caller that reports
success has durable records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future
from types import TracebackType

from ...durable.journal import JournalEntry
from ...durable.keys import entry_key_bytes
from ...errors import KafkaIOError
from ...kafka.config import producer_config
from ...kafka.producer import AckingProducer
from ...serde.journal import JournalCodec, default_journal_codec


class ActionStateWriter:
    """Writes entries to one ActionState topic; use as a context manager.

    Built on the worker's :class:`~agents_stream.kafka.producer.AckingProducer`, so the
    records, their ordering and their acknowledgement are exactly the worker's.

    Args:
        bootstrap: bootstrap servers.
        topic: the ActionState topic (``<app id>-action-state``).
        codec: journal codec (default: the newest schema, single-object framing).
    """

    def __init__(self, bootstrap: str, topic: str, codec: JournalCodec | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.codec = codec or default_journal_codec(None, topic)
        self._producer: AckingProducer | None = None
        self._acks: list[Future[None]] = []
        self.written = 0

    @property
    def producer(self) -> AckingProducer:
        if self._producer is None:
            self._producer = AckingProducer(producer_config(self.bootstrap, {"linger.ms": 20}))
        return self._producer

    def _send(self, key: bytes, value: bytes | None, partition: int) -> None:
        self._acks.append(self.producer.send(self.topic, value, key=key, partition=partition))
        self.written += 1

    def write(self, entries: Iterable[tuple[int, JournalEntry]]) -> None:
        """Queues ``(partition, entry)`` pairs; the key is the entry's compaction key."""
        for partition, entry in entries:
            self._send(entry_key_bytes(entry), self.codec.encode(entry), partition)

    def write_raw(self, records: Iterable[tuple[int, bytes, bytes | None]]) -> None:
        """Queues ``(partition, key, value)`` records as they are (``None``: tombstone)."""
        for partition, key, value in records:
            self._send(key, value, partition)

    def flush(self, timeout: float = 60.0) -> int:
        """Waits for every queued record's acknowledgement; returns the count written.

        Raises:
            KafkaIOError: a record was not acknowledged (named in the message).
        """
        acks, self._acks = self._acks, []
        deadline = time.monotonic() + timeout
        if self._producer is not None:
            self._producer.flush(timeout)
        # Each ack waited on by itself, not with concurrent.futures.wait: the producer's
        # futures need not be stock Futures (wait relies on their internals).
        failures: list[BaseException] = []
        for i, ack in enumerate(acks):
            try:
                error = ack.exception(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                pending = len(acks) - i
                raise KafkaIOError(
                    f"{self.topic}: {pending} records unacknowledged after {timeout}s"
                ) from None
            if error is not None:
                failures.append(error)
        errors = [str(e) for e in failures]
        if errors:
            raise KafkaIOError(f"{len(errors)} records failed: {errors[:3]}")
        return self.written

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(5)

    def __enter__(self) -> ActionStateWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()
