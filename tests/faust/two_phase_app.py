"""Faust app hosting the two-phase orders agent of tests/apps/two_phase_app.py (run as a
subprocess: ``python -m tests.faust.two_phase_app worker -l info``)."""

from __future__ import annotations

import os

import faust

from agents_stream.faust import durable_agent
from tests.apps.two_phase_app import Orders

faust_app = faust.App(
    os.environ.get("AS_APP_ID", "faust-two-phase"),
    broker=os.environ.get("AS_BROKER", "kafka://127.0.0.1:9092"),
    broker_session_timeout=6,
    broker_commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.5")),
    web_enabled=False,
    store="memory://",
    datadir=os.environ.get("AS_DATA_DIR", ".faust-data"),
    topic_partitions=2,
)
orders = faust_app.topic(os.environ.get("AS_INPUT", "orders"), value_serializer="json")

durable = durable_agent(
    faust_app, Orders, topic=orders, output=os.environ.get("AS_OUTPUT", "receipts")
)

if __name__ == "__main__":
    faust_app.main()
