"""Flink-style Async I/O for agents_stream: bounded, ordered or unordered async calls.

Engine agnostic: the operator knows nothing of Kafka; a host feeds it ``Element``s and
watermarks and receives outputs and failures through callbacks.
"""

from __future__ import annotations

from .errors import AsyncIOTimeout, AsyncOperatorError, CallbackError, OperatorClosedError
from .operator import AsyncWaitOperator, Element, TimeMode
from .retry import (
    NO_RETRY,
    AsyncRetryPredicates,
    AsyncRetryStrategies,
    AsyncRetryStrategy,
    ExponentialBackoffRetryStrategy,
    FixedDelayRetryStrategy,
)

__all__ = [
    "NO_RETRY",
    "AsyncIOTimeout",
    "AsyncOperatorError",
    "AsyncRetryPredicates",
    "AsyncRetryStrategies",
    "AsyncRetryStrategy",
    "AsyncWaitOperator",
    "CallbackError",
    "Element",
    "ExponentialBackoffRetryStrategy",
    "FixedDelayRetryStrategy",
    "OperatorClosedError",
    "TimeMode",
]
