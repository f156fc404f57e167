"""Test app whose record marked ``big`` emits one output of ``AS_PAD`` random hex
characters (incompressible: the producer compresses with lz4, so repeated characters
would shrink below any limit). The producer keeps librdkafka's ``message.max.bytes``
(1 MB): a topic whose ``max.message.bytes`` is lower makes the broker refuse the output
(output topic) or its ActionDone, which holds the outputs (ActionState topic)."""

from __future__ import annotations

import os
import secrets

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(os.environ.get("AS_APP_ID", "oversize-broker"), partitions=2, commit_interval=0.3)
PAD = int(os.environ.get("AS_PAD", "40000"))


class Emitter(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        pad = secrets.token_hex(PAD // 2) if event.input.get("big") else ""
        ctx.send_event(OutputEvent(output={"id": event.input["id"], "pad": pad}))


app.agent(
    Emitter,
    input=os.environ.get("AS_INPUT", "oversize-broker-in"),
    output=os.environ.get("AS_OUTPUT"),
)
