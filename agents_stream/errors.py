"""Root of the library's exception tree; each subsystem derives its own errors from it."""

from __future__ import annotations


class AgentsStreamError(Exception):
    """Base class of every error raised by agents_stream."""


class ConfigurationError(AgentsStreamError):
    """The app, an agent or the command line is configured inconsistently."""


class KafkaIOError(AgentsStreamError):
    """A Kafka client operation failed; ``code`` keeps librdkafka's error code."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class RecordRefusedError(KafkaIOError):
    """The client or the broker refused a record itself (over ``message.max.bytes`` or
    the topic's ``max.message.bytes``, invalid): sending it again fails again, and the
    records sent with it are not at fault."""
