"""Reads one planned offset range from Kafka into Arrow record batches.

This is the executor side of the data source: it runs inside Spark's Python workers,
but it imports nothing from PySpark, so jobs and tests can also call it directly.
Records are consumed in bulk (``Consumer.consume(num_messages=...)``) and turned into
columns with list comprehensions, then into Arrow arrays in one call per column: the
per-record cost is a handful of C calls, which is what keeps a single worker well above
100k records/s.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping

import pyarrow as pa
from confluent_kafka import KafkaError, Message, TopicPartition

from .errors import KafkaSourceError
from .offsets import OffsetRange, new_consumer

HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)


def arrow_schema(*, include_headers: bool = True) -> pa.Schema:
    """The Arrow form of Spark's Kafka source schema, as PySpark converts it (UTC)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


def read_range(
    consumer_conf: Mapping[str, str | bool],
    rng: OffsetRange,
    *,
    include_headers: bool = True,
    batch_size: int = 10_000,
    poll_timeout_s: float = 120.0,
    fail_on_data_loss: bool = True,
) -> Iterator[pa.RecordBatch]:
    """Yields the records of ``rng`` in offset order as Arrow record batches.

    The consumer is assigned (never subscribed) at ``rng.start``, commits nothing, and
    is closed when the iterator finishes or is closed. Offsets without a record inside
    the range (compaction, transaction markers) are skipped: reading stops at the first
    record at or past ``rng.end`` or at the partition's end, whichever comes first.

    Args:
        consumer_conf: librdkafka settings; must include ``enable.partition.eof=true``.
        rng: the range to read.
        include_headers: produce the ``headers`` column.
        batch_size: records per Arrow batch (and per ``consume`` call).
        poll_timeout_s: give up when no record or EOF arrives for this long.
        fail_on_data_loss: raise when the partition now ends before ``rng.end`` (it was
            truncated after planning) instead of returning the records that remain.

    Raises:
        KafkaSourceError: the broker reported an error, the start offset is out of range,
            the partition ends before ``rng.end`` (with ``fail_on_data_loss``), or no
            progress was made within ``poll_timeout_s``.
    """
    schema = arrow_schema(include_headers=include_headers)
    for records in read_messages(
        consumer_conf,
        rng,
        batch_size=batch_size,
        poll_timeout_s=poll_timeout_s,
        fail_on_data_loss=fail_on_data_loss,
    ):
        yield _to_batch(records, rng, schema, include_headers)


def read_messages(
    consumer_conf: Mapping[str, str | bool],
    rng: OffsetRange,
    *,
    batch_size: int = 10_000,
    poll_timeout_s: float = 120.0,
    fail_on_data_loss: bool = True,
) -> Iterator[list[Message]]:
    """:func:`read_range` before the Arrow step: the data records of ``rng`` in offset
    order, in non-empty lists of at most ``batch_size`` (for readers that turn records
    into something else than Kafka columns, e.g. decoded journal rows).

    Raises:
        KafkaSourceError: as :func:`read_range`.
    """
    if rng.size <= 0:
        return
    consumer = new_consumer(consumer_conf)
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        position = rng.start
        last_progress = time.monotonic()
        while position < rng.end:
            # consume() waits until it has num_messages or the timeout passes, so never
            # ask for more than the range can still hold, or the last call always waits.
            wanted = min(batch_size, rng.end - position)
            msgs = consumer.consume(num_messages=wanted, timeout=1.0)
            if not msgs:
                if time.monotonic() - last_progress > poll_timeout_s:
                    raise KafkaSourceError(
                        f"no records for {poll_timeout_s:.0f}s before the end offset {rng.end}",
                        topic=rng.topic,
                        partition=rng.partition,
                        offset=position,
                    )
                continue
            last_progress = time.monotonic()
            records, position, done = _in_range(msgs, rng, position, fail_on_data_loss)
            if records:
                yield records
            if done:
                break
    finally:
        consumer.close()


def _in_range(
    msgs: list[Message], rng: OffsetRange, position: int, fail_on_data_loss: bool
) -> tuple[list[Message], int, bool]:
    """Keeps the data records below ``rng.end``; returns them, the new position, done."""
    if any(m.error() is not None for m in msgs):
        records: list[Message] = []
        for m in msgs:
            err = m.error()
            if err is None:
                records.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                # The broker has nothing past this offset: the range cannot grow further.
                if m.offset() < rng.end and fail_on_data_loss:
                    raise KafkaSourceError(
                        f"partition ends at {m.offset()}, before the planned end {rng.end}",
                        topic=rng.topic,
                        partition=rng.partition,
                        offset=m.offset(),
                    )
                return _cut(records, rng.end), rng.end, True
            else:
                raise KafkaSourceError(
                    f"fetch failed: {err}",
                    topic=rng.topic,
                    partition=rng.partition,
                    offset=position,
                    code=err.code(),
                )
        msgs = records
    if not msgs:
        return [], position, False
    last = msgs[-1].offset()
    if last < rng.end - 1:
        return msgs, last + 1, False
    return _cut(msgs, rng.end), rng.end, True


def _cut(msgs: list[Message], end: int) -> list[Message]:
    if not msgs or msgs[-1].offset() < end:
        return msgs
    offsets = [m.offset() for m in msgs]
    return msgs[: bisect_left(offsets, end)]


def _to_batch(
    msgs: list[Message], rng: OffsetRange, schema: pa.Schema, include_headers: bool
) -> pa.RecordBatch:
    n = len(msgs)
    stamps = [m.timestamp() for m in msgs]
    arrays = [
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.array([rng.topic] * n, pa.string()),
        pa.array([rng.partition] * n, pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        # Kafka stamps are milliseconds; Spark's are microseconds.
        pa.array([ts * 1000 for _, ts in stamps], pa.int64()).cast(schema.field(5).type),
        # librdkafka numbers timestamp types from 0 = "not available"; Kafka's Java
        # client (and so Spark) from -1, with 0 = CreateTime and 1 = LogAppendTime.
        pa.array([kind - 1 for kind, _ in stamps], pa.int32()),
    ]
    if include_headers:
        headers = [m.headers() for m in msgs]
        if any(headers):
            arrays.append(pa.array([h or None for h in headers], HEADER_TYPE))
        else:
            arrays.append(pa.nulls(n, HEADER_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
