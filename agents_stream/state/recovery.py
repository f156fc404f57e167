"""Cache recovery: replay the ActionState topic tail into a partition's RocksDB cache.

Idempotent by construction: entries are keyed values (put / delete), so replaying a
record that the cache already holds rewrites the same value, and the checkpoint only
moves forward. Steps, for one partition:

1. Read the cache checkpoint (next topic offset it reflects; 0 for a new cache).
2. Fetch from there and learn the partition's high watermark from the fetch itself.
   A checkpoint beyond the high watermark means the topic was recreated (or the broker
   lost its data): the cache is wiped and rebuilt from the beginning.
3. Apply records in write batches (tombstone -> delete) until the high watermark, and
   move the checkpoint with each batch. Every value is decoded once, so a corrupt
   journal record fails the assignment at once, naming its key.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from ..errors import KafkaIOError
from ..kafka.config import reader_config

if TYPE_CHECKING:
    from ..serde.journal import JournalCodec
    from .kafka import PartitionCache

log = logging.getLogger("agents_stream.state")

BATCH = 5000


def rebuild_partition(
    bootstrap: str,
    topic: str,
    partition: int,
    cache: PartitionCache,
    codec: JournalCodec,
    *,
    timeout: float = 60.0,
) -> int:
    start = cache.checkpoint
    consumer = Consumer(reader_config(bootstrap))
    replayed = 0
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(topic, partition, start or OFFSET_BEGINNING)])
        while True:
            msgs = consumer.consume(BATCH, timeout=1.0)
            if not msgs:
                # End of partition is learned from the fetch (partition EOF), not from
                # ListOffsets, which some Kafka-protocol brokers answer imprecisely.
                if time.monotonic() > deadline:
                    raise KafkaIOError(f"no end of partition seen for {topic}[{partition}]")
                continue
            deadline = time.monotonic() + timeout
            records: list[tuple[bytes, bytes | None]] = []
            next_offset = start
            eof = False
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof = True
                        continue
                    raise KafkaIOError(f"reading {topic}[{partition}]: {err}", code=err.code())
                if msg.offset() < start:  # the log restarted below our checkpoint
                    return _restart_from_scratch(bootstrap, topic, partition, cache, codec, 0)
                key = msg.key() or b""
                value = msg.value()
                if value is not None:
                    codec.decode(key, value)  # fail fast on corruption, naming the slot
                records.append((key, value))
                next_offset = msg.offset() + 1
            if records:
                cache.apply(records, next_offset)
                replayed += len(records)
            if eof:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), cached=True
                )
                if start > high:
                    return _restart_from_scratch(bootstrap, topic, partition, cache, codec, high)
                return replayed
    finally:
        consumer.close()


def _restart_from_scratch(
    bootstrap: str,
    topic: str,
    partition: int,
    cache: PartitionCache,
    codec: JournalCodec,
    high: int,
) -> int:
    log.warning(
        "%s[%d]: cache checkpoint is past the topic end (%d); the topic was recreated, "
        "rebuilding the cache from scratch",
        topic,
        partition,
        high,
    )
    for key in list(cache.db.keys()):
        cache.db.delete(key)
    return rebuild_partition(bootstrap, topic, partition, cache, codec)
