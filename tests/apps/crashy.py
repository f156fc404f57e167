"""Crash-test app. Each input names a scenario; code blocks record their side effects in
SQLite (tests/apps/effects.py) and the action parks on file latches so a test can SIGKILL
the worker at a precise point."""

from __future__ import annotations

import asyncio
import enum
import os
import time
import uuid
from dataclasses import dataclass, fields, is_dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

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


class Tier(enum.Enum):
    GOLD = "gold"


@dataclass(frozen=True)
class Point:
    x: int
    y: float


def rich_value(n: int) -> dict:
    """A result from every corner of the journaled value domain that JSON would bend:
    int and tuple keys, tuples, sets, -0.0, nan, a long int, Decimal's exponent, an
    aware datetime, bytes, a dataclass and an enum member."""
    return {
        1: n,
        (2, "b"): [(-0.0, float("nan")), 2**70 + n],
        "amount": Decimal("10.50"),
        "tags": {"x", "y", "z", "w"},
        "frozen": frozenset({1, 2.5}),
        "at": datetime(2026, 11, 25, 19, 0, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        "day": date(2026, 11, 25),
        "took": timedelta(seconds=1.5),
        "raw": bytes(range(256)),
        "id": uuid.UUID(int=n),
        "point": Point(n, 0.1),
        "tier": Tier.GOLD,
        "none": None,
        "flag": True,
    }


def shape(value: object) -> str:
    """``value`` with every type spelled out (sets order-free, nan by name): equal
    shapes mean equal values of equal types, recursively."""
    if isinstance(value, dict):
        items = ", ".join(f"{shape(k)}: {shape(v)}" for k, v in value.items())
        return f"dict{{{items}}}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[{', '.join(shape(v) for v in value)}]"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}{{{', '.join(sorted(shape(v) for v in value))}}}"
    if is_dataclass(value) and not isinstance(value, type):
        inner = ", ".join(f"{f.name}={shape(getattr(value, f.name))}" for f in fields(value))
        return f"{type(value).__qualname__}({inner})"
    if isinstance(value, float) and value != value:
        return "float(nan)"
    return f"{type(value).__qualname__}({value!r})"


def rich(call_id: str, n: int) -> dict:
    effect("rich", call_id)
    return rich_value(n)


def use(call_id: str, value: dict) -> str:
    effect("use", call_id)
    return shape(value)


def refuse(call_id: str, n: int) -> None:
    effect("refuse", call_id)
    raise ValueError(Decimal("2.50"), (n, "x"), {1: b"\x00"})


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
        elif scenario == "charge-after-calls":  # the rolling upgrade: calls, then PENDING
            fetched = ctx.execute(step, "fetch", n)
            scored = ctx.execute(step, "score", n)
            charge = ctx.execute(Charge(), n)
            ctx.send_event(
                OutputEvent(output={"n": n, "results": [fetched, scored], "charge": charge})
            )
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
        elif scenario == "values":  # guarantee 7 across a crash and a new process
            value = ctx.execute(rich, n)
            used = ctx.execute(use, value)  # its args digest is computed from the replay
            try:
                ctx.execute(refuse, n)
            except ValueError as exc:
                error = shape(exc.args)
            park("values")
            ctx.send_event(
                OutputEvent(output={"n": n, "value": shape(value), "used": used, "error": error})
            )
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
