"""Test app for dead-letter replay: one journaled side effect, then a failure outside
any code block until ``AS_FIXED`` is set (the "fix" a replay follows), then a second
side effect. Side effects are counted in ``AS_EFFECTS_DB`` (tests/apps/effects.py)."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from tests.apps import effects

app = App(os.environ.get("AS_APP_ID", "dlq"), partitions=2, commit_interval=0.3)


def reserve(call_id: str, order: str) -> str:
    effects.effect("reserve", call_id)
    return f"r-{order}"


def ship(call_id: str, order: str) -> str:
    effects.effect("ship", call_id)
    return f"s-{order}"


class Orders(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        order = event.input["order"]
        reservation = ctx.execute(reserve, order)
        if event.input.get("bad") and not os.environ.get("AS_FIXED"):
            raise RuntimeError(f"shipping address of {order} missing")
        shipment = ctx.execute(ship, order)
        ctx.send_event(OutputEvent(output={"order": order, "r": reservation, "s": shipment}))


app.agent(Orders, input=os.environ.get("AS_INPUT", "dlq-in"), output=os.environ.get("AS_OUTPUT"))
