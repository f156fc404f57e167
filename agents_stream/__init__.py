"""agents_stream: durable, Kafka-partitioned agent actions.

Every call an action wraps in ``ctx.execute`` / ``ctx.execute_async`` is journaled to a
compacted ActionState topic; after a crash or rebalance the action re-runs and journaled
calls are replayed instead of executed again.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_namespace

if TYPE_CHECKING:
    from .agent import Agent, action
    from .aio import AsyncRetryStrategies
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
        TwoPhaseCommitCallable,
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
    "TwoPhaseCommitCallable",
    "UnsupportedValueError",
    "action",
    "register_codec",
    "register_type",
]

__version__ = "0.1.0"


# Where each public name lives. Loaded on first use, so that importing one component
# (e.g. the generic Kafka data source for Spark, agents_stream.spark.source) does not
# load the app, the durable core and their dependencies.
_HOME = {
    "Agent": ".agent",
    "action": ".agent",
    "App": ".app",
    "AsyncRetryStrategies": ".aio",
    "Timers": ".durable.timers",
    "AgentsStreamError": ".errors",
    "ConfigurationError": ".errors",
    "Event": ".events",
    "InputEvent": ".events",
    "OutputEvent": ".events",
    "TimerEvent": ".events",
}


__getattr__, __dir__ = lazy_namespace(
    __name__, globals(), {name: _HOME.get(name, ".durable") for name in __all__}, __all__
)
