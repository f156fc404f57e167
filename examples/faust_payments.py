"""The payments agent (examples/payments.py) hosted by an existing Faust app.

Faust consumes ``orders`` and commits offsets; agents_stream journals every
``ctx.execute*`` call of the agent to ``payments-faust-action-state`` so a crashed or
rebalanced Faust worker replays them instead of charging twice, and acks an order to Faust
only once its receipt is durable.

Run it:  python -m examples.faust_payments worker -l info
         (or: faust -A examples.faust_payments:faust_app worker -l info)
Broker:  FAUST_BROKER (default kafka://127.0.0.1:9092). Needs: pip install '.[faust]'
"""

from __future__ import annotations

import os

import faust

from agents_stream.faust import durable_agent
from examples.payments import Payments

faust_app = faust.App(
    "payments-faust",
    broker=os.environ.get("FAUST_BROKER", "kafka://127.0.0.1:9092"),
    broker_session_timeout=6,
    web_enabled=False,
    store="memory://",
)
orders = faust_app.topic("orders", value_serializer="json")

# A regular Faust agent of the same app keeps working alongside the durable one.
# concurrency: up to 64 orders in flight, distinct customers at once, each customer's
# orders in order (the payment API call takes time; one at a time would wait for each).
payments = durable_agent(faust_app, Payments, topic=orders, output="receipts", concurrency=64)


if __name__ == "__main__":
    faust_app.main()
