"""Checked by mypy (tests/unit/test_public_types.py), never run: what users' type checkers
see of the public API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_type

from agents_stream import (
    Agent,
    App,
    DurableCallable,
    InputEvent,
    OutputEvent,
    RetryPolicy,
    RunnerContext,
    TwoPhaseCommitCallable,
    action,
)


def score(user: str, weight: float = 1.0) -> float:
    return len(user) * weight


async def profile(user: str) -> dict[str, int]:
    return {"visits": len(user)}


def charge(call_id: str, amount: int) -> str:
    return f"{call_id}:{amount}"


class Charge(DurableCallable[str]):
    id = "payments.charge"

    def call(self, call_id: str, amount: int) -> str:
        return f"{call_id}:{amount}"

    def reconciler(self) -> str:
        return "found"


@dataclass
class Hold(TwoPhaseCommitCallable[dict[str, str]]):
    order: str

    def prepare(self, call_id: str) -> dict[str, str]:
        return {"hold": call_id}

    def commit(self, prepared: dict[str, str]) -> None: ...

    def abort(self, prepared: dict[str, str]) -> None: ...


class Typed(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        assert_type(ctx.execute(score, "ada"), float)
        assert_type(ctx.execute(score, "ada", weight=2.0), float)
        assert_type(await ctx.execute_async(profile, "ada"), dict[str, int])
        assert_type(await ctx.execute_async(score, "ada"), float)
        assert_type(ctx.execute(charge, 5), str)  # call_id injected
        assert_type(ctx.execute(Charge(), 5), str)
        assert_type(ctx.execute(Hold("o-1")), dict[str, str])
        assert_type(await ctx.execute_async(Hold("o-1")), dict[str, str])
        assert_type(
            ctx.execute(score, "ada", retry=RetryPolicy(max_attempts=2), reconciler=lambda: 1.0),
            float,
        )
        assert_type(await ctx.durable_execute_async(profile, "ada"), dict[str, int])
        ctx.send_event(OutputEvent(output={"ok": True}))


app = App("typed", broker="kafka://127.0.0.1:9092")
app.agent(Typed, input="in", output="out")
