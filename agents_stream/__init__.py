"""agents_stream: durable, Kafka-partitioned agent actions.

Every call an action wraps in ``ctx.execute`` / ``ctx.execute_async`` is journaled to a
compacted ActionState topic; after a crash or rebalance the action re-runs and journaled
calls are replayed instead of executed again.
"""

from .agent import Agent, action
from .app import App
from .durable import (
    CodeBlockViolation,
    DurableCallable,
    DurableCallError,
    JournalDecodeError,
    NonDeterminismError,
    PickleCodec,
    ResultTooLargeError,
    RetryPolicy,
    RunnerContext,
    UnsupportedValueError,
    register_codec,
    register_type,
)
from .durable.timers import Timers
from .errors import AgentsStreamError, ConfigurationError
from .events import Event, InputEvent, OutputEvent, TimerEvent

__all__ = [
    "Agent",
    "AgentsStreamError",
    "App",
    "AsyncRetryStrategies",
    "CodeBlockViolation",
    "ConfigurationError",
    "DurableCallError",
    "DurableCallable",
    "Event",
    "InputEvent",
    "JournalDecodeError",
    "NonDeterminismError",
    "OutputEvent",
    "PickleCodec",
    "ResultTooLargeError",
    "RetryPolicy",
    "RunnerContext",
    "TimerEvent",
    "Timers",
    "UnsupportedValueError",
    "action",
    "register_codec",
    "register_type",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The Async I/O package is only loaded when used.
    if name == "AsyncRetryStrategies":
        from .aio import AsyncRetryStrategies

        return AsyncRetryStrategies
    raise AttributeError(f"module 'agents_stream' has no attribute {name!r}")
