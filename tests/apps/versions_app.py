"""Mixed-schema-versions app (tests/integration/test_mixed_versions.py).

Every code block records its side effect in SQLite (tests/apps/effects.py) and returns a
value that *differs* from what the test journals for it, so an output tells whether a
slot was replayed from the journal or executed. Each input names a scenario; the test
writes the journal of that input with an older (or the newest) codec before any worker
starts.
"""

from __future__ import annotations

import os
from typing import Any

from agents_stream import (
    Agent,
    App,
    DurableCallable,
    InputEvent,
    OutputEvent,
    RunnerContext,
    action,
)
from tests.apps.effects import effect

app = App(
    os.environ.get("AS_APP_ID", "versions"),
    commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.5")),
)


class Declined(Exception):
    """Journaled (by v1) as ``tests.apps.versions_app.Declined``: replay rebuilds this class
    because the module is imported in the worker."""


def lookup(call_id: str, n: int) -> dict[str, Any]:
    effect("lookup", call_id)
    return {"n": n, "by": "executed"}


def charge_card(call_id: str, n: int) -> dict[str, Any]:
    effect("charge_card", call_id)
    return {"n": n, "by": "executed"}


def score(call_id: str, n: int) -> dict[str, Any]:
    effect("score", call_id)
    return {"n": n, "by": "executed"}


class Transfer(DurableCallable):
    """Reconcilable: a PENDING slot must run ``reconciler``, never ``call``."""

    id = "versions.transfer"

    def call(self, call_id: str, amount: int) -> dict[str, Any]:
        effect("transfer", call_id)
        return {"amount": amount, "by": "call"}

    def reconciler(self, call_id: str, amount: int) -> dict[str, Any]:
        effect("reconcile", call_id)
        return {"amount": amount, "by": "reconciler"}


def _caught(ctx: RunnerContext, n: int) -> str:
    try:
        charge_result = ctx.execute(charge_card, n)
    except Exception as exc:  # the journaled exception, re-raised on replay
        return f"{type(exc).__name__}: {exc}"
    return f"no exception: {charge_result}"


class Versions(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        v = event.input
        scenario, n = v["scenario"], v["n"]
        out: dict[str, Any] = {"scenario": scenario, "n": n}
        if scenario in ("v1-result", "fresh"):
            out["lookup"] = ctx.execute(lookup, n)
        elif scenario == "v1-exception":
            out["caught"] = _caught(ctx, n)
        elif scenario == "v2-pending":
            out["transfer"] = ctx.execute(Transfer(), n)
        elif scenario == "v3-succeeded":
            out["score"] = ctx.execute(score, n)
        elif scenario == "mixed":  # one action whose slots were written by v1, v1, v2, v3
            out["lookup"] = ctx.execute(lookup, n)
            out["caught"] = _caught(ctx, n)
            out["transfer"] = ctx.execute(Transfer(), n)
            out["score"] = ctx.execute(score, n)
        elif scenario == "v1-done":  # completed under v1: must not run again
            effect("v1-done-body", f"{event.key}:{event.offset}")
            out["by"] = "executed"
        ctx.send_event(OutputEvent(output=out))


app.agent(
    Versions,
    input=os.environ.get("AS_INPUT", "versions-in"),
    output=os.environ.get("AS_OUTPUT", "versions-out"),
)
