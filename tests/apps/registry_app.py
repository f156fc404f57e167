"""Test app with Avro input and output values through a schema registry (issue 52).

The registry comes from ``AGENTS_STREAM_SCHEMA_REGISTRY`` or ``--schema-registry``; the
App names none. ``AS_ORDER_VERSION`` picks the reader schema of the input (v2 adds
``currency`` with a default, so v1 records stay readable).
"""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "tests.registry",
    "fields": [
        {"name": "order", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}
ORDER_V2 = {
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}],
}
RECEIPT = {
    "type": "record",
    "name": "Receipt",
    "namespace": "tests.registry",
    "fields": [
        {"name": "order", "type": "string"},
        {"name": "amount_cents", "type": "long"},
        {"name": "currency", "type": "string"},
    ],
}

app = App(
    os.environ.get("AS_APP_ID", "registry"),
    commit_interval=0.3,
    subject_name_strategy=os.environ.get("AS_SUBJECTS", "topic"),  # type: ignore[arg-type]
)


def to_cents(amount: float) -> int:
    return round(amount * 100)


class Billing(Agent):
    @action(InputEvent)
    @staticmethod
    def bill(event: InputEvent, ctx: RunnerContext) -> None:
        cents = ctx.execute(to_cents, event.input["amount"])
        order = event.input
        ctx.send_event(
            OutputEvent(
                output={
                    "order": order["order"],
                    "amount_cents": cents,
                    "currency": order.get("currency", "?"),
                }
            )
        )


app.agent(
    Billing,
    input=os.environ.get("AS_INPUT", "registry-in"),
    output=os.environ.get("AS_OUTPUT", "registry-out"),
    input_schema=ORDER_V2 if os.environ.get("AS_ORDER_VERSION", "2") == "2" else ORDER_V1,
    output_schema=RECEIPT,
)
