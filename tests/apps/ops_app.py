"""Test app for the operability tests: topics, app id and partitions from the
environment; one trivial agent that echoes its input."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(
    os.environ.get("AS_APP_ID", "ops"),
    partitions=int(os.environ.get("AS_PARTITIONS", "2")),
    commit_interval=0.5,
)


class Echo(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=event.input))


app.agent(Echo, input=os.environ.get("AS_INPUT", "ops-in"), output=os.environ.get("AS_OUTPUT"))
