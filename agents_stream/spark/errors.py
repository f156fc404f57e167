"""Errors of the Spark subsystem: a missing runtime, bad source options, unreadable ranges.

The data source's own errors live in :mod:`agents_stream.spark.source.errors` (the source
is usable on its own) and are re-exported here.
"""

from __future__ import annotations

from ..errors import AgentsStreamError, ConfigurationError
from .source.errors import KafkaSourceError, KafkaSourceOptionError

__all__ = [
    "KafkaSourceError",
    "KafkaSourceOptionError",
    "MissingTopicError",
    "SparkUnavailableError",
    "TaskRecordError",
]


class SparkUnavailableError(AgentsStreamError):
    """PySpark or a suitable Java runtime is missing; the message names what to install."""


class MissingTopicError(ConfigurationError):
    """A topic the job must read does not exist; the message names it and what it is."""


class TaskRecordError(AgentsStreamError):
    """A task failed on a record: the cause's type and message, then the record's topic,
    partition and offset (what the driver's one-line error shows).

    Attributes:
        topic, partition, offset: the record the task was on.
    """

    def __init__(self, cause: BaseException, *, topic: str, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"{type(cause).__name__}: {cause} (topic {topic}, partition {partition}, "
            f"offset {offset})"
        )
