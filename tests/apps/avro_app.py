"""Test app with Avro input and output topics (single-object framing, no registry)."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "tests.avro",
    "fields": [
        {"name": "order", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}
RECEIPT = {
    "type": "record",
    "name": "Receipt",
    "namespace": "tests.avro",
    "fields": [
        {"name": "order", "type": "string"},
        {"name": "amount_cents", "type": "long"},
        {"name": "customer", "type": "string"},
    ],
}

app = App(os.environ.get("AS_APP_ID", "avro"), commit_interval=0.5)


def to_cents(amount: float) -> int:
    return round(amount * 100)


class Billing(Agent):
    @action(InputEvent)
    @staticmethod
    def bill(event: InputEvent, ctx: RunnerContext) -> None:
        cents = ctx.execute(to_cents, event.input["amount"])
        ctx.send_event(
            OutputEvent(
                output={"order": event.input["order"], "amount_cents": cents, "customer": event.key}
            )
        )


app.agent(
    Billing,
    input=os.environ.get("AS_INPUT", "avro-in"),
    output=os.environ.get("AS_OUTPUT", "avro-out"),
    input_schema=ORDER,
    output_schema=RECEIPT,
)
