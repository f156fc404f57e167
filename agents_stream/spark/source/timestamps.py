"""Spark's timestamp options, resolved to offsets on the driver while planning.

``startingTimestamp`` / ``startingOffsetsByTimestamp`` and ``endingTimestamp`` /
``endingOffsetsByTimestamp`` become per-partition offsets with the broker's offsets-for-
times lookup (``ListOffsets`` by timestamp, at the reader's isolation level): the
earliest offset whose record timestamp is at or after the time. Where no record is:

- a start fails (``startingOffsetsByTimestampStrategy=error``, Spark's default) or
  starts at the end (``latest``);
- an end is the partition's end, as in Spark.

The embedded broker (Tansu) answers the lookup with offset 0 whatever the time, so
timestamps are refused there rather than silently reading everything.
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .errors import KafkaSourceError, KafkaSourceOptionError
from .options import LATEST, TimestampSpec, TimestampStrategy

__all__ = ["resolve_timestamps", "timestamp_option"]


def timestamp_option(spec: TimestampSpec, *, starting: bool) -> str:
    """The Spark option a timestamp spec came from (for messages)."""
    side = "starting" if starting else "ending"
    return f"{side}Timestamp" if isinstance(spec, int) else f"{side}OffsetsByTimestamp"


def resolve_timestamps(
    consumer: Consumer,
    spec: TimestampSpec,
    partitions: Sequence[tuple[str, int]],
    *,
    starting: bool,
    strategy: TimestampStrategy,
    cluster_id: str,
    timeout_s: float,
) -> dict[str, dict[int, int]]:
    """Offsets of ``spec`` for each partition read, ``-1`` (latest) where the end applies.

    Args:
        consumer: the planner's consumer (its isolation level is the lookup's).
        spec: one timestamp for all partitions, or one per partition (must name each).
        partitions: the partitions read.
        starting: a start (``strategy`` applies) or an end (no record: the end).
        strategy: ``startingOffsetsByTimestampStrategy``.
        cluster_id: the cluster's id; the embedded broker's starts with ``tansu``.
        timeout_s: how long the lookup may take.

    Raises:
        KafkaSourceOptionError: the embedded broker, or a per-partition spec that does not
            name exactly the partitions read.
        KafkaSourceError: the lookup failed, or no record is at or after a starting time
            with the ``error`` strategy.
    """
    option = timestamp_option(spec, starting=starting)
    if cluster_id.startswith("tansu"):
        raise KafkaSourceOptionError(
            "the embedded broker answers offset lookups by timestamp with offset 0 whatever "
            "the time; read from Apache Kafka, or give startingOffsets / endingOffsets",
            option=option,
        )
    stamps = _per_partition(spec, partitions, option)
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(t, p, ts) for (t, p), ts in stamps.items()], timeout=timeout_s
        )
    except KafkaException as exc:
        err = exc.args[0]
        raise KafkaSourceOptionError(
            f"offset lookup by timestamp failed ({err}); check that the cluster is reachable "
            "and raise kafkaConsumer.pollTimeoutMs if it is slow",
            option=option,
            code=getattr(err, "code", lambda: None)(),
        ) from exc
    out: dict[str, dict[int, int]] = {}
    for tp in found:
        if tp.error is not None:
            raise KafkaSourceError(
                f"{option}: offset lookup failed: {tp.error}",
                topic=tp.topic,
                partition=tp.partition,
                code=tp.error.code(),
            )
        offset = tp.offset
        if offset < 0:  # no record at or after the time (at this isolation level)
            if starting and strategy == "error":
                raise KafkaSourceError(
                    f"{option}: no record at or after timestamp {stamps[(tp.topic, tp.partition)]}"
                    "; set startingOffsetsByTimestampStrategy=latest to start at the end "
                    "there instead",
                    topic=tp.topic,
                    partition=tp.partition,
                )
            offset = LATEST
        out.setdefault(tp.topic, {})[tp.partition] = offset
    return out


def _per_partition(
    spec: TimestampSpec, partitions: Sequence[tuple[str, int]], option: str
) -> dict[tuple[str, int], int]:
    if isinstance(spec, int):
        return {tp: spec for tp in partitions}
    named = {(t, p): ts for t, parts in spec.items() for p, ts in parts.items()}
    known = set(partitions)
    extra = sorted(set(named) - known)
    missing = sorted(known - set(named))
    if extra or missing:
        what = (
            f"{extra[0][0]}[{extra[0][1]}] is not among the partitions read"
            if extra
            else "missing " + ", ".join(f"{t}[{p}]" for t, p in missing[:10])
        )
        raise KafkaSourceOptionError(
            f"must name every partition read, and only those (as in Spark); {what}",
            option=option,
        )
    return named
