"""Topic helpers for tests and demos: produce values, read a topic to its end."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from ..kafka.admin import TopicAdmin, TopicSpec
from ..kafka.config import reader_config


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes | None
    headers: dict[str, bytes]

    def json(self) -> Any:
        return None if self.value is None else json.loads(self.value)


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int = 4) -> None:
    TopicAdmin(bootstrap).ensure([TopicSpec(t, partitions) for t in topics])


class Inputs:
    """A test's input producer whose every delivery is checked.

    Idempotent: a retried batch (a leader not elected yet on a new topic) must neither
    duplicate its records (a fault test would count the copy as a call run twice) nor
    land after later ones of the same key (Apache Kafka reordered a key's records here
    without it). :meth:`close` raises when a record was refused or not acknowledged in
    time: an input that never reached the topic otherwise shows up much later as a
    "lost" record the worker never saw."""

    def __init__(self, bootstrap: str, **conf: Any) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "partitioner": "murmur2_random",
                "log_level": 3,
                "enable.idempotence": True,
                **conf,
            }
        )
        self.sent = 0
        self.errors: list[str] = []

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}] key {msg.key()!r}: {err}")

    def send(
        self,
        topic: str,
        value: bytes,
        key: str | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        if headers:
            kwargs["headers"] = headers
        while True:
            try:
                self._producer.produce(
                    topic,
                    key=None if key is None else key.encode(),
                    value=value,
                    on_delivery=self._delivered,
                    **kwargs,
                )
                break
            except BufferError:
                self._producer.poll(0.1)
        self.sent += 1
        self._producer.poll(0)

    def close(self, timeout: float = 60.0) -> int:
        """Wait for every acknowledgement; the number sent. Raises if one is missing."""
        left = self._producer.flush(timeout)
        if left or self.errors:
            raise RuntimeError(
                f"{left} of {self.sent} inputs not acknowledged in {timeout:.0f}s; "
                f"{len(self.errors)} refused: {self.errors[:5]}"
            )
        return self.sent


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[str | None, Any]],
    *,
    raw: bool = False,
) -> int:
    """Produce (key, value) pairs; values are JSON-encoded unless ``raw``. Returns count;
    raises unless every one was acknowledged (:class:`Inputs`)."""
    inputs = Inputs(bootstrap)
    for key, value in records:
        inputs.send(topic, value if raw else json.dumps(value).encode(), key)
    return inputs.close(30)


def read_topic(bootstrap: str, topic: str, *, timeout: float = 10.0) -> list[Record]:
    """Every record of ``topic`` up to each partition's end (learned from the fetch)."""
    md = Consumer({"bootstrap.servers": bootstrap, "group.id": "md"}).list_topics(
        topic, timeout=timeout
    )
    parts = sorted(md.topics[topic].partitions) if topic in md.topics else []
    if not parts:
        return []
    consumer = Consumer(reader_config(bootstrap, {"group.id": f"read-{uuid.uuid4().hex}"}))
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[Record] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < len(parts) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                    continue
                at_end.discard(msg.partition())
                key = msg.key()
                out.append(
                    Record(
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        None if key is None else key.decode(),
                        msg.value(),
                        {k: v for k, v in (msg.headers() or [])},
                    )
                )
    finally:
        consumer.close()
    return out


def wait_for_records(
    bootstrap: str, topic: str, count: int, *, timeout: float = 60.0
) -> list[Record]:
    """Poll ``topic`` until it holds at least ``count`` records (or raise TimeoutError)."""
    deadline = time.monotonic() + timeout
    records: list[Record] = []
    while time.monotonic() < deadline:
        records = read_topic(bootstrap, topic)
        if len(records) >= count:
            return records
        time.sleep(0.3)
    raise TimeoutError(f"{topic} has {len(records)} records, expected {count}")
