"""Flink-style Async I/O for agents_stream: bounded, ordered or unordered async calls.

Engine agnostic: the operator knows nothing of Kafka; a host feeds it ``Element``s and
watermarks and receives outputs and failures through callbacks::

    op = AsyncWaitOperator(
        lookup,                      # async def lookup(value) -> output | list[output]
        ordered=True,
        capacity=100,
        timeout=5.0,
        retry=AsyncRetryStrategies.fixed_delay(3, 0.2).if_exception(ConnectionError),
        emit=produce_outputs,        # (element, outputs) -> None | awaitable
        fail=send_to_dlq,            # (element, exc) -> None | awaitable
        emit_watermark=forward_wm,   # (timestamp) -> None | awaitable
    )
    await op.process(Element(value, timestamp=ts, token=(partition, offset)))
    await op.process_watermark(ts)
    await op.drain()                 # shutdown; or op.abort() -> unsettled elements

Every accepted element is settled exactly once, by ``emit`` or ``fail``; an input is
safe to commit once it and every earlier input of its partition are settled (in
unordered mode, ``pending()`` names those that are not).
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
