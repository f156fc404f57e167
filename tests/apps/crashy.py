"""Crash-test app. Each input names a scenario; code blocks record their side effects in
SQLite (tests/apps/effects.py) and the action parks on file latches so a test can SIGKILL
the worker at a precise point."""

from __future__ import annotations

import asyncio
import os
import time
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
from tests.apps.effects import acked, effect, has_effect, park

app = App(
    os.environ.get("AS_APP_ID", "crashy"),
    commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.5")),
)


def step(call_id: str, name: str, n: int, delay: float = 0.0) -> str:
    effect(name, call_id)
    time.sleep(delay)
    return f"{name}-{n}"


async def step_async(call_id: str, name: str, n: int, delay: float = 0.0) -> str:
    effect(name, call_id)
    await asyncio.sleep(delay)
    return f"{name}-{n}"


def failing(call_id: str, n: int) -> None:
    effect("failing", call_id)
    raise ValueError(f"declined {n}")


class Charge(DurableCallable):
    """The function does the side effect, then parks *before returning*: PENDING is
    journaled, the result is not."""

    id = "crashy.charge"

    def call(self, call_id: str, amount: int) -> dict:
        effect("charge", call_id)
        park("in-charge")
        return {"charged": amount, "by": "call"}

    def reconciler(self, call_id: str, amount: int) -> dict:
        effect("reconcile", call_id)
        if has_effect(call_id):
            return {"charged": amount, "by": "reconciler"}
        raise LookupError("no charge")


def charge_parked(call_id: str, amount: int) -> dict:
    effect("charge", call_id)
    park("in-charge")
    return {"charged": amount, "by": "call"}


@dataclass
class Scored(Event):
    n: int = 0
    first: str = ""


class Crashy(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        v = event.input
        scenario = v["scenario"]
        n = v.get("n", 0)
        if scenario == "calls":  # (a) and the chaos run: three journaled calls
            results = []
            for i, name in enumerate(("fetch", "score", "notify")):
                fn = step_async if i == 1 else step
                delay = v.get("delay", 0.0)
                if i == 1:
                    r = await ctx.execute_async(fn, name, n, delay)
                else:
                    r = ctx.execute(fn, name, n, delay)
                acked(ctx.ref.call_id(app.id, i))
                results.append(r)
                park(f"after-{i}")
            ctx.send_event(OutputEvent(output={"n": n, "results": results}))
        elif scenario == "reconcile":  # (b)
            charge = ctx.execute(Charge(), n)
            ctx.send_event(OutputEvent(output={"n": n, "charge": charge}))
        elif scenario == "reconcile-zero":  # (b) the Flink Agents form: no arguments
            charge_id = ctx.ref.call_id(app.id, 0)

            def lookup() -> dict:
                effect("reconcile", charge_id)
                if has_effect(charge_id):
                    return {"charged": n, "by": "reconciler"}
                raise LookupError("no charge")

            charge = ctx.execute(charge_parked, n, reconciler=lookup)
            ctx.send_event(OutputEvent(output={"n": n, "charge": charge}))
        elif scenario == "exception":  # (c)
            try:
                ctx.execute(failing, n)
            except ValueError as exc:
                caught = f"{type(exc).__name__}: {exc}"
            park("after-failure")
            ctx.send_event(OutputEvent(output={"n": n, "caught": caught}))
        elif scenario == "reorder":  # (d) the deploy after the crash calls in another order
            names = ["A", "B"] if os.environ.get("AS_VARIANT", "v1") == "v1" else ["A", "C", "B"]
            out = []
            for i, name in enumerate(names):
                out.append(ctx.execute(step, name, n))
                park(f"reorder-{i}")
            ctx.send_event(OutputEvent(output={"n": n, "results": out}))
        elif scenario == "two-actions":  # (e) first action completes, second parks
            first = ctx.execute(step, "first", n)
            ctx.short_term_memory.set("count", ctx.short_term_memory.get("count", 0) + 1)
            ctx.send_event(Scored(n=n, first=first))

    @action(Scored)
    @staticmethod
    def finish(event: Scored, ctx: RunnerContext) -> None:
        second = ctx.execute(step, "second", event.n)
        park("second")
        count = ctx.short_term_memory.get("count")
        ctx.send_event(
            OutputEvent(
                output={"n": event.n, "first": event.first, "second": second, "count": count}
            )
        )


app.agent(
    Crashy,
    input=os.environ.get("AS_INPUT", "crashy-in"),
    output=os.environ.get("AS_OUTPUT", "crashy-out"),
)
