"""The end of a partition as a reader reaches it, on brokers whose ListOffsets is wrong.

The embedded broker (Tansu 0.6) answers ListOffsets(latest) with the base offset of a
partition's last batch plus one: after a batched produce the end it reports is short by
the rest of that batch (``tail --from end`` printed old records again, the console showed
lag -1). Its fetch responses carry the right high watermark, and a consumer's
partition-EOF event comes at the right place: the reported end is only where reading
starts, and the end is where the reader's EOF comes.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition


def read_ends(
    consumer: Any, partitions: list[tuple[str, int]], *, timeout: float = 5.0
) -> dict[tuple[str, int], int]:
    """The end offset of each ``(topic, partition)`` as ``consumer`` reads it: where its
    partition-EOF event comes (the high watermark read_uncommitted, the last stable offset
    read_committed). Reads from one record before the end ListOffsets reports, so on a
    correct broker that is one record per partition.

    ``consumer`` must have ``enable.partition.eof`` set; its assignment is replaced (and
    cleared on return). A partition whose EOF does not come within ``timeout`` seconds
    gets the larger of the listed end and the fetched high watermark.

    Raises:
        KafkaException: ListOffsets failed (no such partition, the cluster unreachable).
    """
    listed = {
        (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout)
        for t, p in partitions
    }
    ends: dict[tuple[str, int], int] = {}
    pending = set(listed)
    consumer.assign(
        [TopicPartition(t, p, max(low, high - 1)) for (t, p), (low, high) in listed.items()]
    )
    deadline = time.monotonic() + timeout
    try:
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.05):
                err = msg.error()
                if err is None:
                    continue
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                key = (msg.topic(), msg.partition())
                if key in pending:
                    ends[key] = msg.offset()
                    pending.discard(key)
        for t, p in pending:  # no EOF in time: the best end known
            _, fetched = consumer.get_watermark_offsets(TopicPartition(t, p), cached=True)
            listed_high = listed[(t, p)][1]
            ends[(t, p)] = listed_high if fetched == OFFSET_INVALID else max(fetched, listed_high)
        return ends
    finally:
        consumer.unassign()
