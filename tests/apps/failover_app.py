"""Failover test app: one journaled call per input (counted in SQLite, tests/apps/effects.py),
then an output naming the worker process and the wall time it processed the record."""

from __future__ import annotations

import os
import time

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from tests.apps.effects import acked, effect

app = App(
    os.environ.get("AS_APP_ID", "failover"),
    commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.5")),
)


def record(call_id: str, n: int) -> int:
    effect("record", call_id)
    return n


class Stamp(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = event.input["n"]
        ctx.execute(record, n)
        acked(ctx.ref.call_id(app.id, 0))
        # Not journaled on purpose: the test wants when and where the output was made.
        ctx.send_event(OutputEvent(output={"n": n, "pid": os.getpid(), "t": time.time()}))


app.agent(
    Stamp,
    input=os.environ.get("AS_INPUT", "failover-in"),
    output=os.environ.get("AS_OUTPUT", "failover-out"),
)
