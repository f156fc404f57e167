"""The durable core: code blocks journaled per call, replayed after crashes.

Knows nothing of Kafka or Spark; hosts give it an ActionStateStore and an OutputSink.
"""

from .callable import DurableCallable, RetryPolicy, TwoPhaseCommitCallable
from .context import ContextConfig, RunnerContext
from .errors import (
    CodeBlockViolation,
    DurableCallError,
    DurableError,
    JournalDecodeError,
    NonDeterminismError,
    PayloadError,
    ResultTooLargeError,
    UnsupportedValueError,
)
from .journal import ActionDone, ActionRef, CallEntry, CallStatus, MemorySnapshot, Truncation
from .payload import JsonCodec, PickleCodec
from .runner import ActionRunner, RecordInput, RecordOutcome
from .sink import OutputSink, Sink, SinkItem
from .values import register_codec, register_type

__all__ = [
    "ActionDone",
    "ActionRef",
    "ActionRunner",
    "CallEntry",
    "CallStatus",
    "CodeBlockViolation",
    "ContextConfig",
    "DurableCallError",
    "DurableCallable",
    "DurableError",
    "JournalDecodeError",
    "JsonCodec",
    "MemorySnapshot",
    "NonDeterminismError",
    "OutputSink",
    "PayloadError",
    "PickleCodec",
    "RecordInput",
    "RecordOutcome",
    "ResultTooLargeError",
    "RetryPolicy",
    "RunnerContext",
    "Sink",
    "SinkItem",
    "Truncation",
    "TwoPhaseCommitCallable",
    "UnsupportedValueError",
    "register_codec",
    "register_type",
]
