"""Old import path of :mod:`agents_stream.spark.source.offsets`, kept for existing imports."""

from __future__ import annotations

from .source.offsets import (
    OffsetRange,
    Watermarks,
    fetch_watermarks,
    plan_offset_ranges,
    plan_ranges,
)

__all__ = [
    "OffsetRange",
    "Watermarks",
    "fetch_watermarks",
    "plan_offset_ranges",
    "plan_ranges",
]
