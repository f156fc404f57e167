"""Test app: keyless records and tombstones. ``AS_TOMBSTONES`` ("skip" or "deliver") is
passed to ``app.agent``; topics and app id come from the environment."""

from __future__ import annotations

import asyncio
import os
import time

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(os.environ.get("AS_APP_ID", "keyless"), commit_interval=0.5)


async def nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


class Keyless(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        if event.input is None:
            ctx.send_event(OutputEvent(output={"key": event.key, "tombstone": True}))
            return
        if event.input.get("memory"):
            ctx.short_term_memory.get("seen")
        started = time.time()
        await ctx.execute_async(nap, event.input.get("sleep", 0.0))
        ctx.send_event(
            OutputEvent(
                output={
                    "key": event.key,
                    "n": event.input["n"],
                    "start": started,
                    "end": time.time(),
                }
            )
        )


app.agent(
    Keyless,
    input=os.environ.get("AS_INPUT", "keyless-in"),
    output=os.environ.get("AS_OUTPUT", "keyless-out"),
    tombstones=os.environ.get("AS_TOMBSTONES", "skip"),  # type: ignore[arg-type]
)
