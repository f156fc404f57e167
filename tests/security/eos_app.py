"""An exactly-once app for the secured cluster: one journaled call per record, echoed."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(
    os.environ.get("AS_APP_ID", "sec-eos"),
    partitions=2,
    commit_interval=0.3,
    processing_guarantee="exactly_once",
)


def stamp(call_id: str, order: str) -> str:
    return f"{order}-{call_id[-6:]}"


class Orders(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        order = event.input["order"]
        ctx.send_event(OutputEvent(output={"order": order, "stamp": ctx.execute(stamp, order)}))


app.agent(Orders, input=os.environ.get("AS_INPUT", "eos-in"), output=os.environ.get("AS_OUTPUT"))
