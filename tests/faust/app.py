"""Faust app hosting a durable agent, for the crash tests (run as a subprocess:
``python -m tests.faust.app worker -l info``). Code blocks record their side effects in
SQLite (tests/apps/effects.py) and the action parks on file latches."""

from __future__ import annotations

import os

import faust

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.faust import durable_agent
from tests.apps.effects import acked, effect, park

faust_app = faust.App(
    os.environ.get("AS_APP_ID", "faust-durable"),
    broker=os.environ.get("AS_BROKER", "kafka://127.0.0.1:9092"),
    broker_session_timeout=6,
    broker_commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.5")),
    web_enabled=False,
    store="memory://",
    datadir=os.environ.get("AS_DATA_DIR", ".faust-data"),
    topic_partitions=2,
)
orders = faust_app.topic(os.environ.get("AS_INPUT", "orders"), value_serializer="json")


def step(call_id: str, name: str, n: int) -> str:
    effect(name, call_id)
    return f"{name}-{n}"


async def step_async(call_id: str, name: str, n: int) -> str:
    effect(name, call_id)
    return f"{name}-{n}"


class Steps(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = event.input["n"]
        if event.input.get("fail"):
            raise ValueError(f"declined {n}")
        results = []
        for i, name in enumerate(("fetch", "score", "notify")):
            if i == 1:
                r = await ctx.execute_async(step_async, name, n)
            else:
                r = ctx.execute(step, name, n)
            acked(ctx.ref.call_id(faust_app.conf.id, i))
            results.append(r)
            park(f"after-{i}")
            if i == 0 and event.input.get("fail_after_fetch") and not os.environ.get("AS_FIXED"):
                raise ValueError(f"declined {n} after fetch")  # fixed by a redeploy
        total = ctx.short_term_memory.get("count", 0) + 1
        ctx.short_term_memory.set("count", total)
        ctx.send_event(OutputEvent(output={"n": n, "results": results, "count": total}))


durable = durable_agent(
    faust_app,
    Steps,
    topic=orders,
    output=os.environ.get("AS_OUTPUT", "receipts"),
    on_error=os.environ.get("AS_ON_ERROR", "dlq"),  # type: ignore[arg-type]
    concurrency=int(os.environ.get("AS_CONCURRENCY", "1")),
)

if __name__ == "__main__":
    faust_app.main()
