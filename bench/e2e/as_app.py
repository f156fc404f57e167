"""The agents_stream side of the end-to-end bench, configured by environment variables.

``AS_BENCH_APP`` (app id), ``AS_BENCH_INPUT``/``AS_BENCH_OUTPUT`` (topics),
``AS_BENCH_CALLS`` (journaled calls per record), ``AS_BENCH_KIND`` (``sync``,
``async``, or ``async_inline``: an async action calling the sync ``ctx.execute``),
``AS_BENCH_CALL_MS`` (each call's latency). Run with
``agents-stream worker -A bench.e2e.as_app:app``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

CALLS = int(os.environ.get("AS_BENCH_CALLS", "1"))
KIND = os.environ.get("AS_BENCH_KIND", "sync")
# A call's latency: 0 is a call that returns at once (the framework's own cost); a few
# ms to a few seconds is the service call a real action journals.
CALL_S = float(os.environ.get("AS_BENCH_CALL_MS", "0")) / 1000


def lookup(value: Any, n: int) -> int:
    if CALL_S:
        time.sleep(CALL_S)
    return n + 1


async def lookup_async(value: Any, n: int) -> int:
    if CALL_S:
        await asyncio.sleep(CALL_S)
    return n + 1


class SyncBench(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = 0
        for _ in range(CALLS):
            n = ctx.execute(lookup, event.key, n)
        ctx.send_event(OutputEvent(output={**event.input, "seen": True, "n": n}))


class SyncNoCallBench(Agent):
    """The sync row with no call: an action that calls no code block (a pure step, as
    the peers' rows are), so it runs without a carrier. SyncBench with 0 calls names
    ``ctx.execute`` and pays for one (two greenlet switches per record)."""

    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output={**event.input, "seen": True, "n": 0}))


class AsyncBench(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = 0
        for _ in range(CALLS):
            n = await ctx.execute_async(lookup_async, event.key, n)
        ctx.send_event(OutputEvent(output={**event.input, "seen": True, "n": n}))


class AsyncInlineBench(Agent):
    """DESIGN's example shape: an async action calling the sync ``ctx.execute``."""

    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = 0
        for _ in range(CALLS):
            n = ctx.execute(lookup, event.key, n)
        ctx.send_event(OutputEvent(output={**event.input, "seen": True, "n": n}))


AGENTS = {
    "sync": SyncBench if CALLS else SyncNoCallBench,
    "async": AsyncBench,
    "async_inline": AsyncInlineBench,
}
app = App(
    os.environ.get("AS_BENCH_APP", "bench-e2e"),
    producer_config=dict(
        kv.split("=", 1) for kv in os.environ.get("AS_BENCH_PRODUCER", "").split(",") if kv
    ),
)
app.agent(
    AGENTS[KIND],
    input=os.environ.get("AS_BENCH_INPUT", "bench-in"),
    output=os.environ.get("AS_BENCH_OUTPUT", "bench-out"),
)
