"""Test app whose record marked ``big`` emits two outputs that each fit the producer's
``message.max.bytes`` (30,000 here) while its ActionDone, which holds both, does not."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(
    os.environ.get("AS_APP_ID", "oversize"),
    partitions=2,
    commit_interval=0.3,
    producer_config={"message.max.bytes": 30_000},
)


class Emitter(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        pad = "x" * 18_000 if event.input.get("big") else ""
        for part in (1, 2):
            ctx.send_event(OutputEvent(output={"id": event.input["id"], "part": part, "pad": pad}))


app.agent(
    Emitter, input=os.environ.get("AS_INPUT", "oversize-in"), output=os.environ.get("AS_OUTPUT")
)
