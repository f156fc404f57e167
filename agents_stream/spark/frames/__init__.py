"""An app's ActionState topic as Spark DataFrames, and the writer the jobs append with.

Built on the generic Kafka source (:mod:`agents_stream.spark.source`) plus the journal
codec: :mod:`.action_state` reads the topic, applies compaction and groups the decoded
rows into ActionStates; :mod:`.journal_rows` is the executor-side decoding (no PySpark
import); :mod:`.state_writer` appends journal entries with the store's key layout
(reconcile, backfill ``--write-journal``). Names resolve on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .action_state import (
        action_states,
        compact,
        decode_journal,
        read_action_states,
        read_journal,
    )
    from .journal_rows import JOURNAL_COLUMNS, JOURNAL_DDL, decode_batches
    from .state_writer import ActionStateWriter

_EXPORTS = {
    "action_states": "action_state",
    "compact": "action_state",
    "decode_journal": "action_state",
    "read_action_states": "action_state",
    "read_journal": "action_state",
    "JOURNAL_COLUMNS": "journal_rows",
    "JOURNAL_DDL": "journal_rows",
    "decode_batches": "journal_rows",
    "ActionStateWriter": "state_writer",
}

__all__ = [
    "JOURNAL_COLUMNS",
    "JOURNAL_DDL",
    "ActionStateWriter",
    "action_states",
    "compact",
    "decode_batches",
    "decode_journal",
    "read_action_states",
    "read_journal",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
