"""Reading an ActionState topic for the ``state`` commands: every key's live value."""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from ..durable.keys import decode_identity
from ..errors import KafkaIOError


def add_read_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long reading the ActionState topic to its end may take before the "
        "command gives up with exit 1 (default: 30)",
    )


def read_latest(
    bootstrap: str,
    topic: str,
    *,
    timeout: float = 30.0,
    wanted: Any = None,
    where: dict[bytes, int] | None = None,
) -> dict[bytes, bytes]:
    """The live value of every key of ``topic`` (tombstoned keys removed); ``where``, if
    given, is filled with the partition each live key was read from.

    Steps: assign every partition at the beginning; poll; a partition is done when the
    consumer reports EOF at the fetch high watermark; stop when all are done.

    Raises:
        KafkaIOError: the topic does not exist, a fetch fails, or the end is not
            reached within ``timeout`` seconds.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from ..kafka.admin import REACH_TIMEOUT, TopicAdmin
    from ..kafka.config import reader_config

    # Reaches the cluster first: a refused login or certificate ends in one line naming
    # the setting, at once (the consumer below would wait out the timeout, then raise).
    # An unreachable cluster is said within the CLI's start-up budget, not --timeout.
    TopicAdmin(bootstrap, min(timeout, REACH_TIMEOUT)).partition_counts([topic])
    consumer = Consumer(
        reader_config(
            bootstrap, {"group.id": f"agents-stream-state-cli-{uuid.uuid4().hex}", "log_level": 0}
        )
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error else "no partitions"
            raise KafkaIOError(f"cannot read topic {topic!r}: {reason}")
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]
        consumer.assign(partitions)
        pending = {tp.partition for tp in partitions}
        ends: dict[int, int] = {}
        live: dict[bytes, bytes] = {}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaIOError(
                    f"end of {topic!r} not reached in {timeout}s (partitions {sorted(pending)})"
                )
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaIOError(f"reading {topic!r}: {err}", code=err.code())
                # The high watermark as first seen, not as it moves on: read_committed,
                # the EOF comes at the last stable offset, below the current high
                # watermark while exactly-once workers keep a transaction open (see
                # host/output_log.py).
                end = ends.get(msg.partition())
                if end is None:
                    end = ends[msg.partition()] = consumer.get_watermark_offsets(
                        TopicPartition(topic, msg.partition()), cached=True
                    )[1]
                if msg.offset() >= end:
                    pending.discard(msg.partition())
                continue
            key = msg.key() or b""
            if wanted is not None and not wanted(key):
                continue
            value = msg.value()
            if value is None:
                live.pop(key, None)
            else:
                live[key] = value
                if where is not None:
                    where[key] = msg.partition()
        return live
    finally:
        consumer.close()


def identity(raw_key: bytes) -> list[str]:
    try:
        return decode_identity(raw_key)
    except UnicodeDecodeError:
        return []
