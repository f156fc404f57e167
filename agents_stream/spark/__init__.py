"""Spark batch jobs over agents_stream topics: a Kafka data source, a decoded ActionState
reader, the audit / backfill / reconcile jobs (:mod:`agents_stream.spark.jobs`, also
``agents-stream spark ...``) and session helpers.

Nothing here is imported by the streaming runtime, and importing this package does not
import PySpark: names are resolved on first use, so ``agents_stream.spark.errors`` and
the offset planner stay usable without a JVM.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .action_state import action_states, compact, read_action_states, read_journal
    from .errors import KafkaSourceError, KafkaSourceOptionError, SparkUnavailableError
    from .jobs.audit import run_audit
    from .jobs.backfill import run_backfill
    from .jobs.reconcile import Ledger, run_reconcile
    from .kafka_source import SOURCE_NAME, KafkaDataSource, read_kafka
    from .offsets import OffsetRange, plan_offset_ranges, plan_ranges
    from .options import KafkaSourceOptions, source_options
    from .record_reader import read_range
    from .session import check_java, get_spark, register_data_sources
    from .state_writer import ActionStateWriter

_EXPORTS = {
    "KafkaSourceError": "errors",
    "KafkaSourceOptionError": "errors",
    "SparkUnavailableError": "errors",
    "SOURCE_NAME": "kafka_source",
    "KafkaDataSource": "kafka_source",
    "read_kafka": "kafka_source",
    "source_options": "options",
    "OffsetRange": "offsets",
    "plan_offset_ranges": "offsets",
    "plan_ranges": "offsets",
    "KafkaSourceOptions": "options",
    "read_range": "record_reader",
    "check_java": "session",
    "get_spark": "session",
    "register_data_sources": "session",
    "action_states": "action_state",
    "compact": "action_state",
    "read_action_states": "action_state",
    "read_journal": "action_state",
    "run_audit": "jobs.audit",
    "run_backfill": "jobs.backfill",
    "Ledger": "jobs.reconcile",
    "run_reconcile": "jobs.reconcile",
    "ActionStateWriter": "state_writer",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
