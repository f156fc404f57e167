"""Errors of the Spark subsystem: a missing runtime, bad source options, unreadable ranges.

The data source's own errors live in :mod:`agents_stream.spark.source.errors` (the source
is usable on its own) and are re-exported here.
"""

from __future__ import annotations

from ..errors import AgentsStreamError
from .source.errors import KafkaSourceError, KafkaSourceOptionError

__all__ = ["KafkaSourceError", "KafkaSourceOptionError", "SparkUnavailableError"]


class SparkUnavailableError(AgentsStreamError):
    """PySpark or a suitable Java runtime is missing; the message names what to install."""
