"""Deterministic app for the Spark jobs' tests: the worker and a Spark backfill must
produce the same outputs for the same inputs.

Inputs are JSON objects ``{"n": int, "scenario": ...}``:

- no scenario: ``enrich`` (async) and ``classify`` calls, a per-key memory counter, and a
  second action (``Pipeline.finish``) that emits the output;
- ``"fail"``: a call that raises ValueError, caught by the action;
- ``"charge"``: a reconcilable call (:class:`Charge`) that parks on the ``in-charge``
  latch after its side effect, so a test can SIGKILL the worker with the slot PENDING.

Side effects are counted in SQLite when ``AS_EFFECTS_DB`` is set (worker processes);
Spark executors, which do not see the test's environment, just run the functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agents_stream import (
    Agent,
    App,
    DurableCallable,
    Event,
    InputEvent,
    OutputEvent,
    RunnerContext,
    action,
)
from tests.apps.effects import effect as _effect
from tests.apps.effects import park

app = App(
    os.environ.get("AS_APP_ID", "spark-app"),
    commit_interval=0.3,
    # Audits of anomalies need the completed ActionStates; AS_PRUNE=1 runs a healthy,
    # pruned deployment (completed-through markers are then what says "done").
    prune_completed=os.environ.get("AS_PRUNE") == "1",
    partitions=2,
)


def effect(kind: str, call_id: str) -> None:
    if os.environ.get("AS_EFFECTS_DB"):
        _effect(kind, call_id)


async def enrich(call_id: str, n: int) -> dict:
    effect("enrich", call_id)
    return {"n": n, "sq": n * n}


def classify(call_id: str, sq: int) -> str:
    effect("classify", call_id)
    return "high" if sq > 50 else "low"


def declined(call_id: str, n: int) -> None:
    effect("declined", call_id)
    raise ValueError(f"declined {n}")


class Charge(DurableCallable):
    """PENDING is journaled before ``call`` runs; ``call`` parks before returning."""

    id = "spark_app.charge"

    def call(self, call_id: str, amount: int) -> dict:
        effect("charge", call_id)
        park("in-charge")
        return {"charged": amount, "by": "call"}

    def reconciler(self, call_id: str, amount: int) -> dict:
        effect("reconcile", call_id)
        return {"charged": amount, "by": "reconciler"}


@dataclass
class Summarized(Event):
    n: int = 0
    label: str = ""
    count: int = 0


class Pipeline(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        v = event.input
        n = int(v.get("n", 0))
        scenario = v.get("scenario")
        if scenario == "charge":
            charge = ctx.execute(Charge(), n)
            ctx.send_event(OutputEvent(output={"n": n, "charge": charge}))
            return
        if scenario == "fail":
            try:
                ctx.execute(declined, n)
            except ValueError as exc:
                ctx.send_event(OutputEvent(output={"n": n, "error": str(exc)}))
            return
        info = await ctx.execute_async(enrich, n)
        label = ctx.execute(classify, info["sq"])
        count = ctx.short_term_memory.get("count", 0) + 1
        ctx.short_term_memory.set("count", count)
        ctx.send_event(Summarized(n=n, label=label, count=count))

    @action(Summarized)
    @staticmethod
    def finish(event: Summarized, ctx: RunnerContext) -> None:
        ctx.send_event(
            OutputEvent(output={"n": event.n, "label": event.label, "count": event.count})
        )


app.agent(
    Pipeline,
    input=os.environ.get("AS_INPUT", "spark-app-in"),
    output=os.environ.get("AS_OUTPUT", "spark-app-out"),
)
