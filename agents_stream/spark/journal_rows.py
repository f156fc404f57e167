"""Old import path of :mod:`agents_stream.spark.frames.journal_rows`, kept for existing imports."""

from __future__ import annotations

from .frames.journal_rows import (
    JOURNAL_ARROW_SCHEMA,
    JOURNAL_COLUMNS,
    JOURNAL_DDL,
    KINDS,
    TAGGED_HEADER,
    action_name,
    decode_batches,
    decode_entries,
    decode_record,
    entry_row,
    payload_json,
)

__all__ = [
    "JOURNAL_ARROW_SCHEMA",
    "JOURNAL_COLUMNS",
    "JOURNAL_DDL",
    "KINDS",
    "TAGGED_HEADER",
    "action_name",
    "decode_batches",
    "decode_entries",
    "decode_record",
    "entry_row",
    "payload_json",
]
