"""Test app for code-block concurrency: each record's one ``ctx.execute`` waits at a
barrier for ``AS_PARTIES`` code blocks to be running at the same time (``AS_WAIT_S``
seconds at most), so a record only succeeds if the worker runs that many at once."""

from __future__ import annotations

import os
import threading

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(
    os.environ.get("AS_APP_ID", "slow-calls"),
    partitions=int(os.environ.get("AS_PARTITIONS", "2")),
    commit_interval=0.5,
)
BARRIER = threading.Barrier(
    int(os.environ.get("AS_PARTIES", "8")), timeout=float(os.environ.get("AS_WAIT_S", "30"))
)


def call_service(key: str) -> str:
    """Stands for a slow service call: blocks a code-block thread until its peers run."""
    BARRIER.wait()
    return f"served {key}"


class Caller(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=ctx.execute(call_service, event.key)))


app.agent(Caller, input=os.environ.get("AS_INPUT", "slow-in"), output=os.environ.get("AS_OUTPUT"))
