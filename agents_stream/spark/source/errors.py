"""Errors of the Kafka data source: malformed options, ranges that cannot be read as planned.

Every refusal of the source is a :class:`KafkaSourceError` (option errors included), in
one line that names the option or the partition and what to do instead: a Spark job
surfaces only the message text, so the message has to carry the fix.

They derive from :mod:`agents_stream.errors` (a leaf module with no imports), so a
standalone user can catch :class:`~agents_stream.errors.ConfigurationError` /
:class:`~agents_stream.errors.AgentsStreamError` like an agents_stream app does.
"""

from __future__ import annotations

from ...errors import AgentsStreamError, ConfigurationError

__all__ = ["KafkaSourceError", "KafkaSourceOptionError"]


class KafkaSourceError(AgentsStreamError):
    """A read of the ``agents_stream.kafka`` source is refused or cannot go as planned.

    Raised when offsets were deleted by retention (``failOnDataLoss``), when a requested
    offset lies beyond the partition's end, when the broker stops returning records
    before the range is complete, and (as :class:`KafkaSourceOptionError`) for options.

    Attributes:
        topic: the topic of the range (``None`` when no partition is concerned).
        partition: the Kafka partition of the range (``None`` likewise).
        offset: the offset at which reading or planning failed (``None`` if unknown).
        code: librdkafka's error code when a Kafka client error caused it.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        code: int | None = None,
    ) -> None:
        where = f"{topic}[{partition}]: " if topic is not None else ""
        # One line: a Spark job shows the message inside its own trace, where a line
        # break would split the fix from the option it is about.
        super().__init__(" ".join(f"{where}{message}".split()))
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.code = code


class KafkaSourceOptionError(ConfigurationError, KafkaSourceError):
    """An option of the ``agents_stream.kafka`` data source is missing, malformed or
    refused; the message starts with the option's name and says what to write instead.

    Attributes:
        option: the offending option name, e.g. ``startingOffsets``.
    """

    def __init__(self, message: str, *, option: str, code: int | None = None) -> None:
        KafkaSourceError.__init__(self, f"{option}: {message}", code=code)
        self.option = option
