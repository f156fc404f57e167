"""Old import path of :mod:`agents_stream.spark.source.record_reader`, kept for existing imports."""

from __future__ import annotations

from .source.record_reader import (
    HEADER_TYPE,
    arrow_schema,
    read_messages,
    read_range,
)

__all__ = [
    "HEADER_TYPE",
    "arrow_schema",
    "read_messages",
    "read_range",
]
