"""librdkafka configurations. Users' ``consumer_config``/``producer_config`` win."""

from __future__ import annotations

from typing import Any


def consumer_config(
    bootstrap: str, group_id: str, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        # Offsets are committed by the worker only once every action of a record is done.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # A short session makes failover (and group joins) take seconds, not tens of them.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1500,
        "max.poll.interval.ms": 300000,
        "log_level": 3,
    }
    conf.update(overrides or {})
    return conf


def producer_config(bootstrap: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        # Idempotence keeps per-partition order across retries: an ActionDone is never
        # durable unless the call results before it are.
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "batch.num.messages": 10000,
        "compression.type": "lz4",
        # Same key -> same partition as Java clients and Kafka Streams.
        "partitioner": "murmur2_random",
        "log_level": 3,
    }
    conf.update(overrides or {})
    return conf


def reader_config(bootstrap: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A group-less consumer for replaying a topic (cache rebuild, inspection)."""
    import uuid

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"agents-stream-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52428800,
        # librdkafka backs off 1 s between fetches once its queue is full; replay wants
        # the next fetch right away.
        "fetch.queue.backoff.ms": 10,
        "log_level": 3,
    }
    conf.update(overrides or {})
    return conf
