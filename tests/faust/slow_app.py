"""Faust app whose durable agent runs records concurrently by key (``AS_CONCURRENCY``):
a record flagged ``barrier`` makes its one ``ctx.execute`` wait until ``AS_PARTIES``
such calls run at the same time (``AS_WAIT_S`` seconds at most), so those records only
succeed if the host runs that many at once; every record appends its ``n`` to its key's
memory, so the outputs show in which order a key's records ran. Run as a subprocess:
``python -m tests.faust.slow_app worker -l info``."""

from __future__ import annotations

import os
import threading

import faust

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.faust import durable_agent

faust_app = faust.App(
    os.environ.get("AS_APP_ID", "faust-slow"),
    broker=os.environ.get("AS_BROKER", "kafka://127.0.0.1:9092"),
    broker_session_timeout=6,
    broker_commit_interval=0.5,
    web_enabled=False,
    store="memory://",
    datadir=os.environ.get("AS_DATA_DIR", ".faust-data"),
    topic_partitions=2,
)
orders = faust_app.topic(os.environ.get("AS_INPUT", "orders"), value_serializer="json")
BARRIER = threading.Barrier(
    int(os.environ.get("AS_PARTIES", "8")), timeout=float(os.environ.get("AS_WAIT_S", "30"))
)


def call_service(key: str, barrier: bool) -> str:
    """Stands for a slow service call: waits until its peers run too."""
    if barrier:
        BARRIER.wait()
    return f"served {key}"


class Caller(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        served = ctx.execute(call_service, event.key, bool(event.input.get("barrier")))
        seen = [*ctx.short_term_memory.get("seen", []), event.input["n"]]
        ctx.short_term_memory.set("seen", seen)
        ctx.send_event(OutputEvent(output={"served": served, "seen": seen}))


durable = durable_agent(
    faust_app,
    Caller,
    topic=orders,
    output=os.environ.get("AS_OUTPUT", "served"),
    concurrency=int(os.environ.get("AS_CONCURRENCY", "1")),
)

if __name__ == "__main__":
    faust_app.main()
