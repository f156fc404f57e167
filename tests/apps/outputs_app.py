"""Test app whose action emits ``n`` outputs ``{"k": key, "j": j}`` per input
(tests/integration/test_outputs_in_log.py)."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(os.environ.get("AS_APP_ID", "outputs"), partitions=1, commit_interval=0.3)


class Emitter(Agent):
    @action(InputEvent)
    @staticmethod
    def emit(event: InputEvent, ctx: RunnerContext) -> None:
        for j in range(event.input["n"]):
            ctx.send_event(OutputEvent(output={"k": event.key, "j": j}))


app.agent(
    Emitter,
    input=os.environ.get("AS_INPUT", "outputs-in"),
    output=os.environ.get("AS_OUTPUT", "outputs-out"),
)
