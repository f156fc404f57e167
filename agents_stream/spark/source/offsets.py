"""Planning of batch reads: which offsets of which partitions a Kafka read covers.

Planning runs once, on the driver, before any record is read:

1. Resolve the topics (``subscribe`` list, ``assign``, or ``subscribePattern`` found
   anywhere in the name as Spark does, internal topics left out) and their partitions
   from cluster metadata.
2. Find each partition's low watermark and its *end*, as a real fetch reports it at the
   read's isolation level: ``read_uncommitted``, the high watermark of a fetch response;
   ``read_committed``, the last stable offset (where a ``read_committed`` fetch reports
   the end of the partition: no reader gets past an open transaction, so a range planned
   further would never complete). ListOffsets alone is not trusted because some
   Kafka-protocol brokers (Tansu) answer it with the last batch's base offset + 1 (and
   0 for ``read_committed``); the fetch starts one record before that answer, so on
   Apache Kafka it moves almost no data.
3. Resolve the timestamp options to offsets with the broker's offsets-for-times lookup
   (at the same isolation level), then ``startingOffsets`` / ``endingOffsets`` against
   the ends, checking for deleted data and impossible ranges (``failOnDataLoss``).
4. Split ranges larger than ``maxRecordsPerPartition`` into consecutive slices.

The result is a plain list of :class:`OffsetRange`; Spark readers, backfill and audit
jobs can all consume it, and it imports nothing from PySpark.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from .client_names import config_error
from .errors import KafkaSourceError, KafkaSourceOptionError
from .options import (
    EARLIEST,
    LATEST,
    KafkaSourceOptions,
    OffsetSpec,
    compile_topic_pattern,
    source_options,
)
from .timestamps import resolve_timestamps

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
    """Low watermark and fetch-confirmed end of one partition: the high watermark, or
    with ``read_committed`` the last stable offset."""

    low: int
    high: int


def new_consumer(conf: Mapping[str, Any]) -> Consumer:
    """A librdkafka consumer; a configuration librdkafka refuses is one option line.

    Raises:
        KafkaSourceOptionError: librdkafka refused a setting (named in the message).
    """
    try:
        return Consumer(dict(conf))
    except KafkaException as exc:
        raise config_error(exc, conf) from exc


def plan_offset_ranges(options: KafkaSourceOptions) -> list[OffsetRange]:
    """Plans the offset ranges of a batch read (steps in the module docstring).

    Args:
        options: parsed source options (see :meth:`KafkaSourceOptions.from_options`).

    Returns:
        Ranges sorted by topic, partition and start; empty partitions yield an empty
        range, so every planned partition appears at least once.

    Raises:
        KafkaSourceOptionError: the offsets name topics or partitions that are not read,
            a topic does not exist, or timestamps are asked of the embedded broker.
        KafkaSourceError: a start was deleted by retention or an explicit end lies beyond
            the partition's end (with ``failOnDataLoss``), a start lies after its end, or
            no record is at or after a starting timestamp (``startingOffsetsByTimestamp
            Strategy=error``).
    """
    timeout_s = options.poll_timeout_ms / 1000
    consumer = new_consumer(options.consumer_conf("planner"))
    try:
        metadata = _metadata(consumer)
        partitions = _resolve_partitions(metadata, options)
        if not partitions:  # a pattern that matches no topic: Spark reads 0 rows
            return []
        marks = fetch_watermarks(
            consumer, partitions, timeout_s=timeout_s, read_committed=options.read_committed
        )
        starting, ending = options.starting, options.ending
        for side, stamps in (
            ("starting", options.starting_timestamps),
            ("ending", options.ending_timestamps),
        ):
            if stamps is None:
                continue
            resolved = resolve_timestamps(
                consumer,
                stamps,
                partitions,
                starting=side == "starting",
                strategy=options.timestamp_strategy,
                cluster_id=metadata.cluster_id or "",
                timeout_s=timeout_s,
            )
            starting, ending = (resolved, ending) if side == "starting" else (starting, resolved)
    finally:
        consumer.close()
    if options.starting_timestamps is None:
        _check_spec_names(starting, partitions, "startingOffsets")
    if options.ending_timestamps is None:
        _check_spec_names(ending, partitions, "endingOffsets")
    ranges: list[OffsetRange] = []
    planned: list[OffsetRange] = []
    for topic, partition in partitions:
        mark = marks[(topic, partition)]
        start = _resolve(starting, topic, partition, mark, default=EARLIEST)
        end = _resolve(ending, topic, partition, mark, default=LATEST)
        start, end = _validate(topic, partition, start, end, mark, options)
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
    read_committed: bool = False,
) -> dict[tuple[str, int], Watermarks]:
    """Low watermark and fetch-confirmed end of each partition.

    The consumer must have ``enable.partition.eof`` set and the isolation level named by
    ``read_committed``; its assignment is replaced. ``read_uncommitted``: the end is the
    high watermark of the first fetch response. ``read_committed``: the offset of the
    partition-EOF event, which a ``read_committed`` consumer raises at the last stable
    offset (an open transaction's records and everything after them are past it).

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
    eof: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            if time.monotonic() > deadline:
                topic, partition = min(pending)
                raise KafkaSourceError(
                    f"no fetch response within {timeout_s:.0f}s while planning; raise "
                    "kafkaConsumer.pollTimeoutMs if the cluster is slow to answer",
                    topic=topic,
                    partition=partition,
                )
            # read_uncommitted needs one event per partition; read_committed reads on to
            # the EOF (a whole partition on brokers whose ListOffsets says 0): batches.
            wanted = max(len(pending), 500) if read_committed else len(pending)
            for msg in consumer.consume(num_messages=wanted, timeout=0.05):
                err = msg.error()
                key = (msg.topic() or "?", -1 if msg.partition() is None else msg.partition())
                if err is None:
                    if not read_committed:
                        pending.discard(key)
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof[key] = msg.offset()
                    pending.discard(key)
                else:
                    raise KafkaSourceError(
                        f"fetch failed while planning: {err}",
                        topic=key[0],
                        partition=key[1],
                        code=err.code(),
                    )
        marks: dict[tuple[str, int], Watermarks] = {}
        for (topic, partition), (low, listed_high) in listed.items():
            if read_committed:
                marks[(topic, partition)] = Watermarks(low=low, high=eof[(topic, partition)])
                continue
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            # A fetch never reports less than ListOffsets on a correct broker; keep the
            # larger so a missing cached value cannot shrink the range.
            high = listed_high if high == OFFSET_INVALID else max(high, listed_high)
            marks[(topic, partition)] = Watermarks(low=low, high=high)
        return marks
    finally:
        consumer.unassign()


def _metadata(consumer: Consumer) -> Any:
    try:
        return consumer.list_topics(timeout=_METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaSourceOptionError(
            f"cannot reach the cluster ({exc.args[0]}); check the address and the "
            "kafka.security.* / kafka.sasl.* options",
            option="kafka.bootstrap.servers",
        ) from exc


def _resolve_partitions(metadata: Any, options: KafkaSourceOptions) -> list[tuple[str, int]]:
    if options.assign is not None:
        return _assigned(metadata, options.assign)
    if options.subscribe_pattern is not None:
        regex = compile_topic_pattern(options.subscribe_pattern)
        # Spark lists topics with the admin client, which leaves internal ones out, and
        # keeps those in which the pattern is found (Java's Matcher.find), not only
        # those it matches whole.
        found = [t for t in metadata.topics if regex.search(t)]
        internal = internal_topics(options.kafka_conf, [t for t in found if t.startswith("__")])
        topics = sorted(t for t in found if t not in internal)
        option = "subscribePattern"
    else:
        topics = list(options.topics)
        option = "subscribe"
    out: list[tuple[str, int]] = []
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error else "does not exist"
            raise KafkaSourceOptionError(
                f"topic {topic!r}: {reason}; create it or correct the name", option=option
            )
        out.extend((topic, p) for p in sorted(meta.partitions))
    return out


# Kafka's own list (org.apache.kafka.common.internals.Topic), for a broker that cannot
# be asked (no Describe permission on them).
_KAFKA_INTERNAL = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def internal_topics(kafka_conf: Mapping[str, str], candidates: Sequence[str]) -> set[str]:
    """Which of ``candidates`` the brokers flag internal (what Spark's admin listing leaves
    out); only names starting with ``__`` are asked about, Kafka's convention for them."""
    if not candidates:
        return set()
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient

    conf = {
        k: v for k, v in kafka_conf.items() if k in _ADMIN_KEYS or k.startswith(_ADMIN_PREFIXES)
    }
    try:
        admin = AdminClient({**conf, "log_level": "3"})
        futures = admin.describe_topics(TopicCollection(list(candidates)), request_timeout=10)
        return {name for name, fut in futures.items() if fut.result(timeout=15).is_internal}
    except Exception:  # no Describe permission or no answer: Kafka's fixed list
        return {t for t in candidates if t in _KAFKA_INTERNAL}


# The connection settings an admin client needs (the consumer's own settings would only
# make librdkafka warn that it ignores them).
_ADMIN_KEYS = frozenset({"bootstrap.servers", "client.id", "socket.timeout.ms"})
_ADMIN_PREFIXES = ("security.", "sasl.", "ssl.", "client.dns", "broker.address")


def _assigned(metadata: Any, assign: Mapping[str, tuple[int, ...]]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for topic, partitions in sorted(assign.items()):
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error else "does not exist"
            raise KafkaSourceOptionError(
                f"topic {topic!r}: {reason}; create it or correct the name", option="assign"
            )
        missing = [p for p in partitions if p not in meta.partitions]
        if missing:
            raise KafkaSourceOptionError(
                f"topic {topic!r} has no partition {missing[0]} (it has "
                f"{len(meta.partitions)}); name only existing partitions (Spark's source "
                "skips missing ones silently; this one refuses rather than read less than "
                "asked)",
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
    elif spec == "latest" or not isinstance(spec, Mapping):
        offset = LATEST
    else:
        offset = spec.get(topic, {}).get(partition, default)
    if offset == EARLIEST:
        return mark.low
    if offset == LATEST:
        return mark.high
    return offset


def _validate(
    topic: str, partition: int, start: int, end: int, mark: Watermarks, options: KafkaSourceOptions
) -> tuple[int, int]:
    """Checks a resolved range against the partition; with ``failOnDataLoss=false`` a range
    reaching past what the partition holds is cut to it, as Spark's source reads then
    (what is there, with a warning) instead of failing."""
    lenient = not options.fail_on_data_loss
    end_name = (
        f"last stable offset {mark.high} (read_committed: a transaction is open there, or "
        "the partition ends)"
        if options.read_committed
        else f"end {mark.high}"
    )
    if end > mark.high:
        if not lenient:
            raise KafkaSourceError(
                f"ending offset {end} is beyond the partition's {end_name}; give an end at "
                "most there, or set failOnDataLoss=false to end at the partition's end",
                topic=topic,
                partition=partition,
                offset=end,
            )
        end = mark.high
    if start > mark.high:
        if not lenient:
            raise KafkaSourceError(
                f"starting offset {start} is beyond the partition's {end_name}; give a start "
                "at most there, or set failOnDataLoss=false to read nothing from it",
                topic=topic,
                partition=partition,
                offset=start,
            )
        start = end
    if start < mark.low:
        if not lenient:
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
            f"starting offset {start} is after ending offset {end}; fix startingOffsets / "
            "endingOffsets (or the timestamps they came from)",
            topic=topic,
            partition=partition,
            offset=start,
        )
    return start, end
