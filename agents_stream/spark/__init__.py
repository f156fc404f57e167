"""Spark over agents_stream topics, as three layers, each importing only the ones above:

- :mod:`agents_stream.spark.source`: a generic Kafka batch data source for PySpark
  (``agents_stream.kafka``), usable by any Spark job without an agents_stream app;
- :mod:`agents_stream.spark.frames`: an app's ActionState topic as DataFrames (compaction
  applied, any schema version decoded) and the journal writer;
- :mod:`agents_stream.spark.jobs`: the audit / backfill / reconcile jobs (also
  ``agents-stream spark ...``).

:mod:`.session` builds a session with the source registered; the names below are
re-exported from all three for convenience.

Nothing here is imported by the streaming runtime, and importing this package does not
import PySpark: names are resolved on first use, so ``agents_stream.spark.errors`` and
the offset planner stay usable without a JVM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_namespace

if TYPE_CHECKING:
    from .errors import KafkaSourceError, KafkaSourceOptionError, SparkUnavailableError
    from .frames.action_state import action_states, compact, read_action_states, read_journal
    from .frames.state_writer import ActionStateWriter
    from .jobs.audit import run_audit
    from .jobs.backfill import run_backfill
    from .jobs.reconcile import Ledger, run_reconcile
    from .session import check_java, get_spark, register_data_sources
    from .source.datasource import SOURCE_NAME, KafkaDataSource, read_kafka
    from .source.offsets import OffsetRange, plan_offset_ranges, plan_ranges
    from .source.options import KafkaSourceOptions, source_options
    from .source.record_reader import read_range

_EXPORTS = {
    "KafkaSourceError": "errors",
    "KafkaSourceOptionError": "errors",
    "SparkUnavailableError": "errors",
    "SOURCE_NAME": "source.datasource",
    "KafkaDataSource": "source.datasource",
    "read_kafka": "source.datasource",
    "source_options": "source.options",
    "OffsetRange": "source.offsets",
    "plan_offset_ranges": "source.offsets",
    "plan_ranges": "source.offsets",
    "KafkaSourceOptions": "source.options",
    "read_range": "source.record_reader",
    "check_java": "session",
    "get_spark": "session",
    "register_data_sources": "session",
    "action_states": "frames.action_state",
    "compact": "frames.action_state",
    "read_action_states": "frames.action_state",
    "read_journal": "frames.action_state",
    "run_audit": "jobs.audit",
    "run_backfill": "jobs.backfill",
    "Ledger": "jobs.reconcile",
    "run_reconcile": "jobs.reconcile",
    "ActionStateWriter": "frames.state_writer",
}

__all__ = [
    "SOURCE_NAME",
    "ActionStateWriter",
    "KafkaDataSource",
    "KafkaSourceError",
    "KafkaSourceOptionError",
    "KafkaSourceOptions",
    "Ledger",
    "OffsetRange",
    "SparkUnavailableError",
    "action_states",
    "check_java",
    "compact",
    "get_spark",
    "plan_offset_ranges",
    "plan_ranges",
    "read_action_states",
    "read_journal",
    "read_kafka",
    "read_range",
    "register_data_sources",
    "run_audit",
    "run_backfill",
    "run_reconcile",
    "source_options",
]


__getattr__, __dir__ = lazy_namespace(
    __name__, globals(), {name: f".{home}" for name, home in _EXPORTS.items()}, __all__
)
