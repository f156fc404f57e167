"""Test app with Avro input and output values through a schema registry (issue 52).

The registry comes from ``AGENTS_STREAM_SCHEMA_REGISTRY`` or ``--schema-registry``; the
App names none. ``AS_ORDER_VERSION`` picks the reader schema of the input (v2 adds
``currency`` with a default, so v1 records stay readable).

``AS_JOURNAL_VERSION=N`` runs the worker as the release that knew ActionState v1..vN only
(it writes vN and reads newer records through the registry by their writer's id): one
side of a rolling upgrade. ``AS_EFFECTS_DB`` adds a journaled charge per order, counted
in that SQLite file (``tests/apps/effects.py``).
"""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.serde import journal as _journal
from agents_stream.serde import schemas as _schemas
from agents_stream.serde import startup as _startup


def _released_up_to(newest: int):  # type: ignore[no-untyped-def]
    """``load_versions`` of the release whose newest journal schema was ``newest``."""
    load = _schemas.load_versions

    def load_versions(record_type, root=None):  # type: ignore[no-untyped-def]
        found = load(record_type, root)
        if record_type != _schemas.JOURNAL_RECORD_TYPE:
            return found
        return tuple(v for v in found if v.version <= newest)

    return load_versions


if os.environ.get("AS_JOURNAL_VERSION"):
    # The codec and the start-up registration look the versions up where they are used.
    _older = _released_up_to(int(os.environ["AS_JOURNAL_VERSION"]))
    _journal.load_versions = _older  # type: ignore[assignment]
    _startup.load_versions = _older  # type: ignore[assignment]

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


def charge(call_id: str, order: str) -> str:
    from tests.apps.effects import effect

    effect("charge", call_id)
    return order


class Billing(Agent):
    @action(InputEvent)
    @staticmethod
    def bill(event: InputEvent, ctx: RunnerContext) -> None:
        cents = ctx.execute(to_cents, event.input["amount"])
        order = event.input
        if os.environ.get("AS_EFFECTS_DB"):
            ctx.execute(charge, order["order"])
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
