"""Errors of the Kafka data source: malformed options, ranges that cannot be read as planned.

They derive from :mod:`agents_stream.errors` (a leaf module with no imports), so a
standalone user can catch :class:`~agents_stream.errors.ConfigurationError` /
:class:`~agents_stream.errors.AgentsStreamError` like an agents_stream app does.
"""

from __future__ import annotations

from ...errors import AgentsStreamError, ConfigurationError

__all__ = ["KafkaSourceError", "KafkaSourceOptionError"]


class KafkaSourceOptionError(ConfigurationError):
    """An option of the ``agents_stream.kafka`` data source is missing or malformed.

    Attributes:
        option: the offending option name, e.g. ``startingOffsets``.
    """

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


class KafkaSourceError(AgentsStreamError):
    """A planned offset range cannot be read as planned.

    Raised when offsets were deleted by retention (``failOnDataLoss``), when a requested
    offset lies beyond the partition's end, or when the broker stops returning records
    before the range is complete.

    Attributes:
        topic: the topic of the range.
        partition: the Kafka partition of the range.
        offset: the offset at which reading or planning failed (``None`` if unknown).
        code: librdkafka's error code when a Kafka client error caused it.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        partition: int,
        offset: int | None = None,
        code: int | None = None,
    ) -> None:
        super().__init__(f"{topic}[{partition}]: {message}")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.code = code
