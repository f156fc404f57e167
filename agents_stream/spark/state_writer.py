"""Old import path of :mod:`agents_stream.spark.frames.state_writer`, kept for existing imports."""

from __future__ import annotations

from .frames.state_writer import (
    ActionStateWriter,
)

__all__ = [
    "ActionStateWriter",
]
