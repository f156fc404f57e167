"""Test app whose record marked ``big`` emits an output that its topic's Avro schema
makes larger than the producer's ``message.max.bytes`` (30,000 here): the field the
action leaves out defaults to 40,000 characters, while its ActionDone (which journals
the output as the action returned it) stays small."""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(
    os.environ.get("AS_APP_ID", "oversize-output"),
    partitions=2,
    commit_interval=0.3,
    producer_config={"message.max.bytes": 30_000},
)

OUTPUT_SCHEMA = {
    "type": "record",
    "name": "Scored",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "note", "type": "string", "default": "x" * 40_000},
    ],
}


class Scorer(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        output = {"id": event.input["id"]}
        if not event.input.get("big"):
            output["note"] = "ok"
        ctx.send_event(OutputEvent(output=output))


app.agent(
    Scorer,
    input=os.environ.get("AS_INPUT", "oversize-output-in"),
    output=os.environ.get("AS_OUTPUT"),
    output_schema=OUTPUT_SCHEMA,
)
