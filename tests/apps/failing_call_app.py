"""Test app whose one journaled call always raises: the record is dead-lettered, and a
``dlq replay`` before any fix replays the journaled failure (tests/cli/test_cli_replays.py)."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, RunnerContext, action

app = App(os.environ.get("AS_APP_ID", "failing-call"), partitions=1, commit_interval=0.3)


def charge(order: str) -> str:
    raise RuntimeError(f"card of {order} declined")


class Charges(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.execute(charge, event.input["order"])


app.agent(
    Charges, input=os.environ.get("AS_INPUT", "failing-in"), output=os.environ.get("AS_OUTPUT")
)
