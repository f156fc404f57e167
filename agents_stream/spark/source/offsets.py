"""Planning of batch reads: which offsets of which partitions a Kafka read covers.

Planning runs once, on the driver, before any record is read:

1. Resolve the topics (``subscribe`` list or ``subscribePattern``) and their partitions
   from cluster metadata.
2. Find each partition's low watermark and its *end*: the high watermark reported by a
   real fetch response. ListOffsets(latest) is not trusted for the end because some
   Kafka-protocol brokers (Tansu) answer it with the last batch's base offset + 1; the
   fetch starts one record before that answer, so it moves almost no data.
3. Resolve ``startingOffsets`` / ``endingOffsets`` against the watermarks, checking for
   deleted data and impossible ranges.
4. Split ranges larger than ``maxRecordsPerPartition`` into consecutive slices.

The result is a plain list of :class:`OffsetRange`; Spark readers, backfill and audit
jobs can all consume it, and it imports nothing from PySpark.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from .errors import KafkaSourceError, KafkaSourceOptionError
from .options import EARLIEST, LATEST, KafkaSourceOptions, OffsetSpec, source_options

_METADATA_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """A half-open range ``[start, end)`` of offsets of one Kafka partition.

    Offsets inside the range may hold no record (compaction, transaction markers); a
    reader returns the records that exist there, in offset order.
    """

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Number of offsets covered (an upper bound on the records returned)."""
        return self.end - self.start

    def split(self, max_records: int) -> list[OffsetRange]:
        """Cuts the range into consecutive slices of at most ``max_records`` offsets.

        Slices are balanced (sizes differ by at most one) so that Spark tasks get similar
        work; an empty range stays a single empty range.
        """
        if max_records <= 0:
            raise ValueError(f"max_records must be positive, got {max_records}")
        if self.size <= max_records:
            return [self]
        pieces = -(-self.size // max_records)
        base, extra = divmod(self.size, pieces)
        out: list[OffsetRange] = []
        start = self.start
        for i in range(pieces):
            end = start + base + (1 if i < extra else 0)
            out.append(OffsetRange(self.topic, self.partition, start, end))
            start = end
        return out


@dataclass(frozen=True, slots=True)
class Watermarks:
    """Low watermark and fetch-confirmed end (high watermark) of one partition."""

    low: int
    high: int


def plan_offset_ranges(options: KafkaSourceOptions) -> list[OffsetRange]:
    """Plans the offset ranges of a batch read (steps in the module docstring).

    Args:
        options: parsed source options (see :meth:`KafkaSourceOptions.from_options`).

    Returns:
        Ranges sorted by topic, partition and start; empty partitions yield an empty
        range, so every planned partition appears at least once.

    Raises:
        KafkaSourceOptionError: the offsets name topics or partitions that are not read.
        KafkaSourceError: a start was deleted by retention (with ``failOnDataLoss``), an
            explicit offset lies beyond the end, or a start lies after its end.
    """
    consumer = Consumer(options.consumer_conf("planner"))
    try:
        partitions = _resolve_partitions(consumer, options)
        marks = fetch_watermarks(consumer, partitions, timeout_s=options.poll_timeout_ms / 1000)
    finally:
        consumer.close()
    _check_spec_names(options.starting, partitions, "startingOffsets")
    _check_spec_names(options.ending, partitions, "endingOffsets")
    ranges: list[OffsetRange] = []
    planned: list[OffsetRange] = []
    for topic, partition in partitions:
        mark = marks[(topic, partition)]
        start = _resolve(options.starting, topic, partition, mark, default=EARLIEST)
        end = _resolve(options.ending, topic, partition, mark, default=LATEST)
        start, end = _validate(topic, partition, start, end, mark, options.fail_on_data_loss)
        rng = OffsetRange(topic, partition, start, end)
        if options.max_records_per_partition:
            planned.extend(rng.split(options.max_records_per_partition))
        else:
            planned.append(rng)
    ranges = _min_partitions(planned, options.min_partitions)
    return sorted(ranges)


def _min_partitions(ranges: list[OffsetRange], wanted: int | None) -> list[OffsetRange]:
    """Spark's ``minPartitions``: with fewer ranges than wanted, cut each non-empty range
    into ``max(1, round(size / total * wanted))`` near-equal pieces, so big partitions get
    more tasks than small ones."""
    if not wanted or len(ranges) >= wanted:
        return ranges
    total = sum(r.size for r in ranges)
    if total == 0:
        return ranges
    out: list[OffsetRange] = []
    for rng in ranges:
        pieces = max(1, round(rng.size / total * wanted))
        if rng.size == 0 or pieces == 1:
            out.append(rng)
            continue
        bounds = [rng.start + rng.size * i // pieces for i in range(pieces)] + [rng.end]
        out.extend(
            OffsetRange(rng.topic, rng.partition, lo, hi)
            for lo, hi in itertools.pairwise(bounds)
            if hi > lo
        )
    return out


def plan_ranges(
    bootstrap: str,
    topics: str | Sequence[str],
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    **options: Any,
) -> list[OffsetRange]:
    """Plans a read given like :func:`~agents_stream.spark.source.read_kafka`, without Spark.

    Useful for jobs that want the ranges themselves: to log or checkpoint what a
    backfill will cover, or to read them with :func:`~agents_stream.spark.source.read_range`.

    Example::

        for rng in plan_ranges("localhost:9092", "app-action-state"):
            print(rng.topic, rng.partition, rng.start, rng.end)
    """
    opts = source_options(bootstrap, topics, starting=starting, ending=ending, **options)
    return plan_offset_ranges(KafkaSourceOptions.from_options(opts))


def fetch_watermarks(
    consumer: Consumer,
    partitions: Sequence[tuple[str, int]],
    *,
    timeout_s: float = _METADATA_TIMEOUT_S,
) -> dict[tuple[str, int], Watermarks]:
    """Low watermark and fetch-confirmed high watermark of each partition.

    The consumer must have ``enable.partition.eof`` set; its assignment is replaced.

    Raises:
        KafkaSourceError: the broker answered with an error or did not answer in time.
    """
    listed: dict[tuple[str, int], tuple[int, int]] = {}
    for topic, partition in partitions:
        try:
            listed[(topic, partition)] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s, cached=False
            )
        except KafkaException as exc:
            err = exc.args[0]
            raise KafkaSourceError(
                f"cannot list offsets: {err}", topic=topic, partition=partition, code=err.code()
            ) from exc
    # One record before the listed end is enough to get a fetch response, whose high
    # watermark is authoritative; empty partitions answer with an EOF event instead.
    consumer.assign(
        [TopicPartition(t, p, max(low, high - 1)) for (t, p), (low, high) in listed.items()]
    )
    pending = set(listed)
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            if time.monotonic() > deadline:
                topic, partition = min(pending)
                raise KafkaSourceError(
                    f"no fetch response within {timeout_s:.0f}s while planning",
                    topic=topic,
                    partition=partition,
                )
            for msg in consumer.consume(num_messages=len(pending), timeout=0.05):
                err = msg.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaSourceError(
                        f"fetch failed while planning: {err}",
                        topic=msg.topic() or "?",
                        partition=-1 if msg.partition() is None else msg.partition(),
                        code=err.code(),
                    )
                pending.discard((msg.topic(), msg.partition()))
        marks: dict[tuple[str, int], Watermarks] = {}
        for (topic, partition), (low, listed_high) in listed.items():
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            # A fetch never reports less than ListOffsets on a correct broker; keep the
            # larger so a missing cached value cannot shrink the range.
            high = listed_high if high == OFFSET_INVALID else max(high, listed_high)
            marks[(topic, partition)] = Watermarks(low=low, high=high)
        return marks
    finally:
        consumer.unassign()


def _resolve_partitions(consumer: Consumer, options: KafkaSourceOptions) -> list[tuple[str, int]]:
    try:
        metadata = consumer.list_topics(timeout=_METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaSourceOptionError(
            f"cannot reach the cluster: {exc.args[0]}", option="kafka.bootstrap.servers"
        ) from exc
    if options.assign is not None:
        return _assigned(metadata, options.assign)
    if options.subscribe_pattern is not None:
        regex = re.compile(options.subscribe_pattern)
        topics = sorted(t for t in metadata.topics if regex.fullmatch(t))
    else:
        topics = list(options.topics)
    out: list[tuple[str, int]] = []
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error else "does not exist"
            raise KafkaSourceOptionError(f"topic {topic!r}: {reason}", option="subscribe")
        out.extend((topic, p) for p in sorted(meta.partitions))
    return out


def _assigned(metadata: Any, assign: Mapping[str, tuple[int, ...]]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for topic, partitions in sorted(assign.items()):
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error else "does not exist"
            raise KafkaSourceOptionError(f"topic {topic!r}: {reason}", option="assign")
        missing = [p for p in partitions if p not in meta.partitions]
        if missing:
            raise KafkaSourceOptionError(
                f"topic {topic!r} has no partition {missing[0]} (it has {len(meta.partitions)})",
                option="assign",
            )
        out.extend((topic, p) for p in partitions)
    return out


def _check_spec_names(spec: OffsetSpec, partitions: Sequence[tuple[str, int]], option: str) -> None:
    """A JSON spec must name exactly the partitions read, as Spark requires (a partition
    left out would silently read from a default Spark refuses to guess)."""
    if not isinstance(spec, Mapping):
        return
    known = set(partitions)
    named = set()
    for topic, offsets in spec.items():
        for partition in offsets:
            if (topic, partition) not in known:
                raise KafkaSourceOptionError(
                    f"{topic}[{partition}] is not among the partitions read", option=option
                )
            named.add((topic, partition))
    if named != known:
        missing = ", ".join(f"{t}[{p}]" for t, p in sorted(known - named)[:10])
        raise KafkaSourceOptionError(
            f"JSON offsets must name every partition read; missing {missing} (use -2 for "
            "earliest, -1 for latest)",
            option=option,
        )


def _resolve(
    spec: OffsetSpec, topic: str, partition: int, mark: Watermarks, *, default: int
) -> int:
    if spec == "earliest":
        offset = EARLIEST
    elif spec == "latest":
        offset = LATEST
    else:
        assert isinstance(spec, Mapping)
        offset = spec.get(topic, {}).get(partition, default)
    if offset == EARLIEST:
        return mark.low
    if offset == LATEST:
        return mark.high
    return offset


def _validate(
    topic: str, partition: int, start: int, end: int, mark: Watermarks, fail_on_data_loss: bool
) -> tuple[int, int]:
    if end > mark.high:
        raise KafkaSourceError(
            f"ending offset {end} is beyond the partition's end {mark.high}",
            topic=topic,
            partition=partition,
            offset=end,
        )
    if start < mark.low:
        if fail_on_data_loss:
            raise KafkaSourceError(
                f"starting offset {start} was deleted (earliest available is {mark.low}); "
                "set failOnDataLoss=false to start at the earliest instead",
                topic=topic,
                partition=partition,
                offset=start,
            )
        # A range wholly deleted by retention becomes empty rather than inverted.
        start = min(mark.low, end)
    if start > end:
        raise KafkaSourceError(
            f"starting offset {start} is after ending offset {end}",
            topic=topic,
            partition=partition,
            offset=start,
        )
    return start, end
