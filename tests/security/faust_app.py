"""A Faust app with a durable agent on the secured cluster (run as a subprocess:
``python -m tests.security.faust_app worker -l info``). Faust's own clients (aiokafka)
and the durable agent's (librdkafka) read the same credentials: the properties file named
by AGENTS_STREAM_KAFKA_CONFIG and the password in AGENTS_STREAM_KAFKA_SASL_PASSWORD."""

from __future__ import annotations

import os
import ssl

import faust

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.faust import durable_agent
from agents_stream.kafka.config import configure

conf = configure()  # the file named by AGENTS_STREAM_KAFKA_CONFIG, then AGENTS_STREAM_KAFKA_*
credentials = (
    faust.SASLCredentials(
        username=conf["sasl.username"],
        password=conf["sasl.password"],
        mechanism=conf["sasl.mechanism"],
        ssl_context=ssl.create_default_context(cafile=conf["ssl.ca.location"]),
    )
    if "sasl.username" in conf
    else None  # imported by `agents-stream acls`, which connects to nothing
)

faust_app = faust.App(
    os.environ["AS_APP_ID"],
    broker=os.environ.get("AGENTS_STREAM_BROKER", "kafka://127.0.0.1:9092"),
    broker_credentials=credentials,
    broker_session_timeout=6,
    broker_commit_interval=0.5,
    web_enabled=False,
    store="memory://",
    datadir=os.environ.get("AS_DATA_DIR", ".faust-data"),
    topic_partitions=2,
)
orders = faust_app.topic(os.environ["AS_INPUT"], value_serializer="json")


def charge(call_id: str, n: int) -> str:
    return f"charged-{n}-{call_id[:8]}"


class Payments(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = event.input["n"]
        receipt = ctx.execute(charge, n)
        ctx.send_event(OutputEvent(output={"n": n, "receipt": receipt}))


durable = durable_agent(faust_app, Payments, topic=orders, output=os.environ["AS_OUTPUT"])

if __name__ == "__main__":
    faust_app.main()
