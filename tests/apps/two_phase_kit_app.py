"""Two-phase calls for the test kit's unit tests: every prepare, commit and abort is
recorded in ``LEDGER`` (this process only); ``FAIL`` makes the action raise after its
prepare, ``COMMIT_FAILURES`` makes that many commits raise first, ``CENTS_OFFSET``
changes the call a redelivery makes (a divergent replay), ``PREPARE_FAILS`` makes that
many prepares raise, ``UNJOURNALABLE`` makes prepare return a value outside the
journaled domain."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agents_stream import (
    Agent,
    App,
    InputEvent,
    OutputEvent,
    RunnerContext,
    TwoPhaseCommitCallable,
    action,
)

LEDGER: list[tuple[str, str]] = []
STATE: dict[str, Any] = {
    "commit_failures": 0,
    "cents_offset": 0,
    "prepare_fails": 0,
    "unjournalable": False,
}


@dataclass(frozen=True)
class Hold(TwoPhaseCommitCallable[dict]):
    order: str
    cents: int

    def prepare(self, call_id: str) -> dict:
        if STATE["prepare_fails"] > 0:
            STATE["prepare_fails"] -= 1
            raise ConnectionError("psp down")
        LEDGER.append(("hold", call_id))
        if STATE["unjournalable"]:
            return {"hold": call_id, "client": object()}  # outside the value domain
        return {"hold": call_id}

    def commit(self, prepared: dict) -> None:
        if STATE["commit_failures"] > 0:
            STATE["commit_failures"] -= 1
            raise ConnectionError("psp unavailable")
        LEDGER.append(("capture", prepared["hold"]))

    def abort(self, prepared: dict) -> None:
        LEDGER.append(("release", prepared["hold"]))


class Pay(Agent):
    @action(InputEvent)
    @staticmethod
    def pay(event: InputEvent, ctx: RunnerContext) -> None:
        cents = event.input["cents"] + STATE["cents_offset"]
        held = ctx.execute(Hold(event.input["order"], cents))
        ctx.execute(str.upper, event.input["order"])  # a plain call after it
        if event.input.get("fail"):
            raise RuntimeError("refused after the hold")
        ctx.send_event(OutputEvent(output={"hold": held["hold"]}))


class PayAsync(Agent):
    @action(InputEvent)
    @staticmethod
    async def pay(event: InputEvent, ctx: RunnerContext) -> None:
        a, b = await asyncio.gather(
            ctx.execute_async(Hold(event.input["order"], 1)),
            ctx.execute_async(Hold(event.input["order"], 2)),
        )
        ctx.send_event(OutputEvent(output={"holds": [a["hold"], b["hold"]]}))


app = App("kit-2pc")
app.agent(Pay, input="orders", output="receipts")
async_app = App("kit-2pc-async")
async_app.agent(PayAsync, input="orders", output="receipts")
