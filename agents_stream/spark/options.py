"""Old import path of :mod:`agents_stream.spark.source.options`, kept for existing imports."""

from __future__ import annotations

from .source.options import (
    EARLIEST,
    LATEST,
    SUPPORTED_OPTIONS,
    KafkaSourceOptions,
    OffsetSpec,
    parse_assign,
    parse_offset_spec,
    source_options,
)

__all__ = [
    "EARLIEST",
    "LATEST",
    "SUPPORTED_OPTIONS",
    "KafkaSourceOptions",
    "OffsetSpec",
    "parse_assign",
    "parse_offset_spec",
    "source_options",
]
