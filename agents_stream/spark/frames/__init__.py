"""An app's ActionState topic as Spark DataFrames, and the writer the jobs append with.

Built on the generic Kafka source (:mod:`agents_stream.spark.source`) plus the journal
codec: :mod:`.action_state` reads the topic, applies compaction and groups the decoded
rows into ActionStates; :mod:`.journal_rows` is the executor-side decoding (no PySpark
import); :mod:`.state_writer` appends journal entries with the store's key layout
(reconcile, backfill ``--write-journal``). Names resolve on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_namespace

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


__getattr__, __dir__ = lazy_namespace(
    __name__, globals(), {name: f".{home}" for name, home in _EXPORTS.items()}, __all__
)
