"""Faust host: durable agents_stream actions inside an existing Faust app.

::

    import faust
    from agents_stream.faust import durable_agent

    faust_app = faust.App("orders", broker="kafka://127.0.0.1:9092")
    orders = faust_app.topic("orders", value_serializer="json")
    durable_agent(faust_app, Payments, topic=orders, output="receipts", app_id="payments")

Run it as any Faust app (``faust -A module worker``). Journaled calls are replayed after a
crash or rebalance and an input is acked to Faust only after its actions completed, as on
the agents_stream worker. Needs the ``faust`` extra (``faust-streaming``).
"""

from .host import DurableAgent, durable_agent, faust_bootstrap
from .records import FaustRecordHandler, record_input, record_key

__all__ = [
    "DurableAgent",
    "FaustRecordHandler",
    "durable_agent",
    "faust_bootstrap",
    "record_input",
    "record_key",
]
