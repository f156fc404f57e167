"""Old import path of :mod:`agents_stream.spark.frames.action_state`, kept for existing imports."""

from __future__ import annotations

from .frames.action_state import (
    CALL_FIELDS,
    TRUNCATION_FIELDS,
    action_states,
    compact,
    decode_journal,
    read_action_states,
    read_journal,
)

__all__ = [
    "CALL_FIELDS",
    "TRUNCATION_FIELDS",
    "action_states",
    "compact",
    "decode_journal",
    "read_action_states",
    "read_journal",
]
