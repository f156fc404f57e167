"""Options of the ``agents_stream.kafka`` data source, parsed once and validated early.

The option names and value formats are those of Spark's own Kafka source so that a job
can switch between ``format("agents_stream.kafka")`` and ``format("kafka")`` unchanged.
Parsing lives apart from Spark so that planners and tests can use it without a session.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .client_names import translate
from .errors import KafkaSourceOptionError

EARLIEST = -2
"""Offset sentinel of Spark's JSON offsets: the partition's low watermark."""
LATEST = -1
"""Offset sentinel of Spark's JSON offsets: the partition's end at planning time."""

OffsetSpec: TypeAlias = Literal["earliest", "latest"] | Mapping[str, Mapping[int, int]]
"""``"earliest"``, ``"latest"`` or per-topic, per-partition offsets (-2 earliest, -1 latest)."""

TimestampSpec: TypeAlias = int | Mapping[str, Mapping[int, int]]
"""One timestamp (ms since the epoch) for every partition read (``startingTimestamp``,
``endingTimestamp``) or one per partition (``startingOffsetsByTimestamp``,
``endingOffsetsByTimestamp``)."""

TimestampStrategy: TypeAlias = Literal["error", "latest"]
"""Spark's ``startingOffsetsByTimestampStrategy``: what a start by timestamp does for a
partition with no record at or after the timestamp (fail, or start at the end)."""

DEFAULT_BATCH_SIZE = 10_000
"""Records per ``consume()`` call and Arrow batch of a reader (``kafka.max.poll.records``)."""

_KAFKA_PREFIX = "kafka."
# Options that the source itself owns; letting users override them would break the
# read-only, commit-free contract of the readers. Spark refuses the first two as well.
_RESERVED_KAFKA = {
    "auto.offset.reset": "is not supported (nor by Spark's source): set startingOffsets "
    "('earliest' or JSON offsets) instead",
    "enable.auto.commit": "is not supported (nor by Spark's source): readers never commit "
    "offsets; remove it",
    "enable.partition.eof": "is set by the source (readers stop at the end of each range); "
    "remove it",
}

SUPPORTED_OPTIONS = (
    "kafka.bootstrap.servers",
    "kafka.*",
    "assign",
    "subscribe",
    "subscribePattern",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "groupIdPrefix",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
    "includeHeaders",
)
"""Options this source reads, with Spark's Kafka source names and meanings."""

# Options of Spark's Kafka source that this one does not implement, with the reason and
# what to do instead: refusing them beats silently reading a different range than the
# same job with format("kafka") would.
_STREAMING = "is a streaming option; this source reads batches only: remove it"
_SPARK_ONLY = {
    "fetchOffset.numRetries": "retries Spark's offset lookups; planning here fails at once "
    "and the Spark action can be run again: remove it",
    "fetchOffset.retryIntervalMs": "retries Spark's offset lookups; planning here fails at "
    "once and the Spark action can be run again: remove it",
    "maxOffsetsPerTrigger": _STREAMING,
    "minOffsetsPerTrigger": _STREAMING,
    "maxTriggerDelay": _STREAMING,
    "topic": "is an option of Spark's Kafka sink, not of its source: use subscribe",
}
_KNOWN = {name.lower(): name for name in SUPPORTED_OPTIONS if name != "kafka.*"}


def _check_names(names: Iterable[str]) -> None:
    valid = ", ".join(SUPPORTED_OPTIONS)
    spark_only = {name.lower(): (name, why) for name, why in _SPARK_ONLY.items()}
    for name in sorted(names):
        key = name.lower()
        if key.startswith(_KAFKA_PREFIX) or key in _KNOWN:
            continue
        if key in spark_only:
            spark_name, why = spark_only[key]
            raise KafkaSourceOptionError(
                f"(an option of Spark's Kafka source) {why}", option=spark_name
            )
        raise KafkaSourceOptionError(f"is not an option; valid options: {valid}", option=name)


def parse_offset_spec(value: str | OffsetSpec, *, option: str) -> OffsetSpec:
    """Parses a ``startingOffsets`` / ``endingOffsets`` value the way Spark does.

    Args:
        value: ``"earliest"``, ``"latest"``, Spark's JSON (``{"t":{"0":23,"1":-2}}``) or an
            already-decoded mapping.
        option: the option name, for error messages and the batch-query rules.

    Returns:
        The literal mode or a mapping ``topic -> {partition: offset}``.

    Raises:
        KafkaSourceOptionError: malformed JSON, or an offset Spark forbids in batch
            queries (``latest`` as a start, ``earliest`` as an end).
    """
    if isinstance(value, str):
        text = value.strip()
        lowered = text.lower()
        if lowered in ("earliest", "latest"):
            spec: OffsetSpec = lowered  # type: ignore[assignment]
            _check_batch_rule(option, lowered)
            return spec
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KafkaSourceOptionError(
                f"expected 'earliest', 'latest' or JSON like {{\"topic\":{{\"0\":23}}}}, got {text!r}",
                option=option,
            ) from exc
    if not isinstance(value, Mapping):
        raise KafkaSourceOptionError(f"expected a JSON object, got {value!r}", option=option)
    if not value:
        raise KafkaSourceOptionError("names no topic", option=option)
    parsed: dict[str, dict[int, int]] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, Mapping):
            raise KafkaSourceOptionError(
                f"topic {topic!r} must map partitions to offsets, got {partitions!r}",
                option=option,
            )
        try:
            offsets = {int(p): int(o) for p, o in partitions.items()}
        except (TypeError, ValueError) as exc:
            raise KafkaSourceOptionError(
                f"topic {topic!r}: partitions and offsets must be integers", option=option
            ) from exc
        for partition, offset in offsets.items():
            if offset < EARLIEST:
                raise KafkaSourceOptionError(
                    f"{topic}[{partition}]: offset {offset} is negative", option=option
                )
            _check_batch_rule(option, {EARLIEST: "earliest", LATEST: "latest"}.get(offset))
        parsed[str(topic)] = offsets
    return parsed


def parse_assign(value: str) -> dict[str, tuple[int, ...]]:
    """Parses ``assign`` the way Spark does: JSON like ``{"topicA":[0,1],"topicB":[2,4]}``."""
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError as exc:
        raise KafkaSourceOptionError(
            f'expected JSON like {{"topicA":[0,1]}}, got {value!r}', option="assign"
        ) from exc
    if not isinstance(decoded, Mapping) or not decoded:
        raise KafkaSourceOptionError(
            f'expected a non-empty JSON object like {{"topicA":[0,1]}}, got {value!r}',
            option="assign",
        )
    out: dict[str, tuple[int, ...]] = {}
    for topic, partitions in decoded.items():
        if (
            not isinstance(partitions, list)
            or not partitions
            or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
            )
        ):
            raise KafkaSourceOptionError(
                f"topic {topic!r} must map to a non-empty list of partition numbers, got "
                f"{partitions!r}",
                option="assign",
            )
        out[str(topic)] = tuple(sorted(set(partitions)))
    return out


def parse_timestamp_spec(value: str, *, option: str) -> TimestampSpec:
    """Parses Spark's timestamp options: one number of milliseconds since the epoch
    (``startingTimestamp``, ``endingTimestamp``) or JSON like
    ``{"topicA":{"0":1700000000000}}`` (``startingOffsetsByTimestamp``,
    ``endingOffsetsByTimestamp``).

    Raises:
        KafkaSourceOptionError: not a number / not that JSON, or a negative timestamp.
    """
    text = value.strip()
    if not option.endswith("ByTimestamp"):
        try:
            stamp = int(text)
        except ValueError as exc:
            raise KafkaSourceOptionError(
                f"expected milliseconds since the epoch, e.g. 1700000000000; got {text!r}",
                option=option,
            ) from exc
        return _non_negative(stamp, option)
    example = '{"topicA":{"0":1700000000000,"1":1700000000000}}'
    try:
        decoded = json.loads(text)
        parsed = {
            str(t): {int(p): int(ts) for p, ts in parts.items()} for t, parts in decoded.items()
        }
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise KafkaSourceOptionError(
            f"expected JSON like {example} (timestamps in ms); got {text!r}", option=option
        ) from exc
    if not parsed or not all(parsed.values()):
        raise KafkaSourceOptionError(f"names no partition; expected e.g. {example}", option=option)
    for parts in parsed.values():
        for stamp in parts.values():
            _non_negative(stamp, option)
    return parsed


def _non_negative(stamp: int, option: str) -> int:
    if stamp < 0:
        raise KafkaSourceOptionError(
            f"timestamp {stamp} is negative; give milliseconds since the epoch", option=option
        )
    return stamp


def _timestamps(opts: Mapping[str, str], side: str) -> TimestampSpec | None:
    """Spark's precedence: ``<side>Timestamp`` over ``<side>OffsetsByTimestamp``, both over
    ``<side>Offsets``."""
    for option in (f"{side}Timestamp", f"{side}OffsetsByTimestamp"):
        raw = opts.get(option.lower())
        if raw is not None and raw.strip():
            return parse_timestamp_spec(raw, option=option)
    return None


def _strategy(opts: Mapping[str, str]) -> TimestampStrategy:
    raw = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if raw not in ("error", "latest"):
        raise KafkaSourceOptionError(
            f"expected 'error' or 'latest', got {raw!r}",
            option="startingOffsetsByTimestampStrategy",
        )
    return "latest" if raw == "latest" else "error"


_NAMED_GROUP = re.compile(r"(?<!\\)\(\?<(?![=!])")


def compile_topic_pattern(pattern: str) -> re.Pattern[str]:
    """``subscribePattern`` as Spark reads it: a Java regular expression, matched with
    ``find`` (anywhere in the topic name, as ``re.search``).

    Java's ``(?<name>...)`` named groups become Python's ``(?P<name>...)``; the rest of
    the syntax the two share (classes, anchors, quantifiers, possessive and atomic forms,
    inline flags).

    Raises:
        KafkaSourceOptionError: Python's ``re`` cannot read the pattern (e.g. Java's
            ``\\p{Alpha}`` classes); the message says what it choked on.
    """
    try:
        return re.compile(_NAMED_GROUP.sub("(?P<", pattern))
    except re.error as exc:
        raise KafkaSourceOptionError(
            f"cannot read {pattern!r} as a regular expression ({exc}); write it in the syntax "
            "Java and Python share (Java-only forms such as \\p{...} classes are not read)",
            option="subscribePattern",
        ) from exc


def _check_batch_rule(option: str, mode: str | None) -> None:
    # Spark rejects these for batch reads because they always yield nothing; keep the
    # same rule so a job behaves identically with either source.
    if option == "startingOffsets" and mode == "latest":
        raise KafkaSourceOptionError("'latest' is not allowed in batch queries", option=option)
    if option == "endingOffsets" and mode == "earliest":
        raise KafkaSourceOptionError("'earliest' is not allowed in batch queries", option=option)


@dataclass(frozen=True, slots=True)
class KafkaSourceOptions:
    """Validated options of one batch read.

    Attributes:
        kafka_conf: librdkafka settings from the ``kafka.*`` options (prefix removed).
        topics: the topics of ``subscribe``; empty when ``subscribe_pattern`` or
            ``assign`` is used.
        subscribe_pattern: a regular expression over topic names, or ``None``.
        assign: the partitions of ``assign`` per topic, or ``None``.
        starting: where each partition's range begins.
        ending: where each partition's range ends (exclusive).
        max_records_per_partition: split ranges larger than this into several Spark
            input partitions; ``None`` keeps one input partition per Kafka partition.
        min_partitions: as Spark's ``minPartitions``: when there are fewer ranges, split
            them (in proportion to their sizes) into about this many.
        starting_timestamps: ``startingTimestamp`` or ``startingOffsetsByTimestamp``
            (they take precedence over ``starting``, as in Spark), resolved with the
            broker's offsets for times; ``None`` when not given.
        ending_timestamps: ``endingTimestamp`` or ``endingOffsetsByTimestamp`` likewise.
        timestamp_strategy: ``startingOffsetsByTimestampStrategy``.
        fail_on_data_loss: Spark's meaning: raise when a requested start was already
            deleted or a requested end lies past the partition's end; with ``False``
            start at the earliest offset still there and end at the partition's end.
        poll_timeout_ms: how long a reader waits for records before giving up.
        include_headers: whether the ``headers`` column is produced (default false,
            as in Spark).
        group_id_prefix: Spark's ``groupIdPrefix``: the readers' (never joined) group
            ids start with it.
        batch_size: records per ``consume()`` call and Arrow batch
            (``kafka.max.poll.records``, the Java client's records per poll).
    """

    kafka_conf: Mapping[str, str] = field(repr=False)  # may hold credentials
    topics: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] | None = None
    starting: OffsetSpec = "earliest"
    ending: OffsetSpec = "latest"
    max_records_per_partition: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    include_headers: bool = False
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    timestamp_strategy: TimestampStrategy = "error"
    group_id_prefix: str = "agents-stream-spark"
    batch_size: int = DEFAULT_BATCH_SIZE
    _group_suffix: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        """Builds the options from a Spark options map (keys are case-insensitive).

        Raises:
            KafkaSourceOptionError: a required option is missing, a value is malformed, or
                an option is unknown or not supported (the message lists the valid ones).
        """
        _check_names(str(k) for k in options)
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        # Spark hands options over with lower-cased keys; librdkafka's names are
        # lower-case too, so they pass through unchanged.
        raw_kafka = {
            k[len(_KAFKA_PREFIX) :]: v for k, v in opts.items() if k.startswith(_KAFKA_PREFIX)
        }
        if not raw_kafka.get("bootstrap.servers"):
            raise KafkaSourceOptionError("is required", option="kafka.bootstrap.servers")
        for reserved in sorted(_RESERVED_KAFKA.keys() & raw_kafka.keys()):
            raise KafkaSourceOptionError(_RESERVED_KAFKA[reserved], option=_KAFKA_PREFIX + reserved)
        kafka_conf = translate(raw_kafka)
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        pattern = opts.get("subscribepattern") or None
        assign = parse_assign(opts["assign"]) if "assign" in opts else None
        if sum(map(bool, (topics, pattern, assign))) != 1:
            raise KafkaSourceOptionError(
                "give exactly one of 'assign' (JSON), 'subscribe' (comma-separated topics) "
                "or 'subscribePattern'",
                option="subscribe",
            )
        if pattern is not None:
            compile_topic_pattern(pattern)
        return cls(
            kafka_conf=kafka_conf,
            topics=topics,
            subscribe_pattern=pattern,
            assign=assign,
            starting=parse_offset_spec(
                opts.get("startingoffsets", "earliest"), option="startingOffsets"
            ),
            ending=parse_offset_spec(opts.get("endingoffsets", "latest"), option="endingOffsets"),
            max_records_per_partition=_positive_int(opts, "maxRecordsPerPartition"),
            min_partitions=_positive_int(opts, "minPartitions"),
            fail_on_data_loss=_boolean(opts, "failOnDataLoss", default=True),
            poll_timeout_ms=_positive_int(opts, "kafkaConsumer.pollTimeoutMs") or 120_000,
            include_headers=_boolean(opts, "includeHeaders", default=False),
            starting_timestamps=_timestamps(opts, "starting"),
            ending_timestamps=_timestamps(opts, "ending"),
            timestamp_strategy=_strategy(opts),
            group_id_prefix=opts.get("groupidprefix", "").strip() or "agents-stream-spark",
            batch_size=_positive_int(opts, "kafka.max.poll.records") or DEFAULT_BATCH_SIZE,
        )

    @property
    def read_committed(self) -> bool:
        """Whether reads skip aborted records and stop at the last stable offset."""
        return self.kafka_conf.get("isolation.level", "").strip().lower() == "read_committed"

    def consumer_conf(self, role: Literal["planner", "reader"]) -> dict[str, str | bool]:
        """librdkafka settings for a short-lived, assign-only, never-committing consumer.

        Args:
            role: part of the unique ``group.id``; the group is never joined or committed
                to, but librdkafka wants one and brokers log it.
        """
        conf: dict[str, str | bool] = {
            "group.id": f"{self.group_id_prefix}-{self._group_suffix}-{role}",
            # Spark's Kafka source reads uncommitted data unless told otherwise; match it.
            "isolation.level": "read_uncommitted",
            "log_level": "3",
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s by default) each
            # time its prefetch queue fills up; a reader drains the queue as fast as it
            # can, so those pauses dominate a bulk read (90k -> 210k records/s locally).
            "fetch.queue.backoff.ms": "10",
            # A fetch at the end of a partition, or at offsets holding only transaction
            # markers, returns no record and so waits fetch.wait.max.ms (500 ms by
            # default) before the EOF that ends planning and ranges: 0.56 -> 0.06 s a plan.
            "fetch.wait.max.ms": "10",
            **self.kafka_conf,
        }
        conf.update(
            {
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # EOF events let readers finish ranges whose last offsets hold no data
                # records (transaction markers, compacted-away keys).
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
            }
        )
        return conf


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise KafkaSourceOptionError(
            f"expected a positive integer, got {raw!r}", option=name
        ) from exc
    if value <= 0:
        raise KafkaSourceOptionError(f"expected a positive integer, got {value}", option=name)
    return value


def _boolean(opts: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise KafkaSourceOptionError(f"expected 'true' or 'false', got {raw!r}", option=name)


def source_options(
    bootstrap: str,
    topics: str | Sequence[str],
    *,
    starting: str | OffsetSpec = "earliest",
    ending: str | OffsetSpec = "latest",
    **options: Any,
) -> dict[str, str]:
    """Builds the option map of a batch read, as strings, for either Kafka source.

    Mapping offsets are encoded as Spark's JSON; booleans as ``true``/``false``. With an
    ``assign`` or ``subscribePattern`` option, ``topics`` is not used (pass ``""``).
    """
    from ...kafka.config import common_config

    names = topics.split(",") if isinstance(topics, str) else list(topics)
    # The common client configuration (security) travels as kafka.* options so that
    # executors' readers connect like the driver; Spark redacts password/secret/token
    # options in its UI and plans.
    out = {
        f"kafka.{k}": _option(v)
        for k, v in common_config().items()
        if not k.startswith("schema.registry.")  # the registry client's, not librdkafka's
    }
    out |= {
        "kafka.bootstrap.servers": bootstrap,
        "startingOffsets": _offsets_option(starting),
        "endingOffsets": _offsets_option(ending),
    }
    if "assign" not in options and "subscribePattern" not in options:
        out["subscribe"] = ",".join(t.strip() for t in names if t.strip())
    for key, value in options.items():
        out[key] = _option(value)
    return out


def _option(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _offsets_option(value: str | OffsetSpec) -> str:
    if isinstance(value, str):
        return value
    return json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in value.items()})
