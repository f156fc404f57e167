"""Test app: per-key sequence check. Topics and app id come from the environment so each
test gets fresh ones."""

from __future__ import annotations

import asyncio
import os
import random

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(os.environ.get("AS_APP_ID", "ordering"), commit_interval=0.5)


async def jitter(n: int) -> int:
    await asyncio.sleep(random.random() * 0.02)
    return n


class Sequencer(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        if event.input.get("explode"):
            raise RuntimeError("asked to explode")
        n = await ctx.execute_async(jitter, event.input["n"])
        prev = ctx.short_term_memory.get("last", -1)
        ctx.short_term_memory.set("last", n)
        ctx.send_event(
            OutputEvent(output={"key": event.key, "n": n, "prev": prev, "pid": os.getpid()})
        )


app.agent(
    Sequencer,
    input=os.environ.get("AS_INPUT", "seq-in"),
    output=os.environ.get("AS_OUTPUT", "seq-out"),
)
