"""A sync action that reaches ``ctx.execute`` only through a helper function.

Its own code names no ``ctx.execute``, so the worker starts it without a carrier greenlet
(``ActionSpec.calls_sync``, agents_stream/agent.py): the first call it makes runs on the
event loop and blocks it until acknowledged, and from then on the action runs in a
carrier (``learn_calls_sync``). Side effects are counted in SQLite (tests/apps/effects.py);
an input with ``"park": true`` parks on the ``after-call`` latch once its call is acked.
"""

from __future__ import annotations

import os

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from tests.apps.effects import acked, effect, park

app = App(
    os.environ.get("AS_APP_ID", "helper-call"),
    commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.5")),
)


def charge(call_id: str, n: int) -> dict:
    effect("charge", call_id)
    return {"charged": n, "call_id": call_id}


def through_helper(ctx: RunnerContext, n: int) -> dict:
    return ctx.execute(charge, n)  # the helper names the call; the action does not


class ViaHelper(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        result = through_helper(ctx, event.input["n"])
        acked(result["call_id"])  # after the call returned: its result was acknowledged
        if event.input.get("park"):
            park("after-call")
        ctx.send_event(OutputEvent(output={"n": event.input["n"], "charged": result["charged"]}))


app.agent(
    ViaHelper,
    input=os.environ.get("AS_INPUT", "helper-in"),
    output=os.environ.get("AS_OUTPUT", "helper-out"),
)
