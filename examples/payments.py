"""Payments agent: score an order's fraud risk (slow API), charge it (side effect that
must never happen twice), keep a running total per customer, emit a receipt.

Run it:  agents-stream worker -A examples.payments:app
Feed it: JSON values like {"order": "o-1", "customer": "c-7", "amount": 42.5} on "orders",
         keyed by customer; receipts appear on "receipts".
"""

from __future__ import annotations

import asyncio
import hashlib
import random

from agents_stream import (
    Agent,
    App,
    DurableCallable,
    InputEvent,
    OutputEvent,
    RetryPolicy,
    RunnerContext,
    action,
)

app = App("payments")

# A stand-in for the payment provider: charges are keyed by idempotency key, as with
# Stripe or Adyen, so the reconciler can ask "did this charge go through?".
PROVIDER_LEDGER: dict[str, float] = {}


async def fraud_score(order: dict) -> float:
    """A slow external model call (~50 ms)."""
    await asyncio.sleep(0.05)
    digest = hashlib.sha256(order["order"].encode()).digest()
    return round(digest[0] / 255, 3)


class Charge(DurableCallable):
    """Reconcilable: PENDING is journaled before the money moves; after a crash in the
    middle the provider is asked instead of charging again."""

    id = "payments.charge"

    def call(self, call_id: str, customer: str, amount: float) -> dict:
        if random.random() < 0.05:
            raise ConnectionError("provider timeout")
        PROVIDER_LEDGER[call_id] = amount
        return {"charge_id": call_id, "amount": amount}

    def reconciler(self, call_id: str, customer: str, amount: float) -> dict:
        if call_id in PROVIDER_LEDGER:
            return {"charge_id": call_id, "amount": PROVIDER_LEDGER[call_id]}
        raise LookupError(f"no charge {call_id}")


class Payments(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        order = event.input
        risk = await ctx.execute_async(fraud_score, order)
        if risk > 0.9:
            ctx.send_event(OutputEvent(output={**order, "status": "rejected", "risk": risk}))
            return
        charge = ctx.execute(
            Charge(),
            order["customer"],
            order["amount"],
            retry=RetryPolicy(max_attempts=5, initial_delay=0.02, retry_on=(ConnectionError,)),
        )
        total = ctx.short_term_memory.get("total", 0.0) + order["amount"]
        ctx.short_term_memory.set("total", round(total, 2))
        ctx.send_event(
            OutputEvent(
                output={
                    **order,
                    "status": "charged",
                    "risk": risk,
                    "charge_id": charge["charge_id"],
                    "customer_total": round(total, 2),
                }
            )
        )


app.agent(Payments, input="orders", output="receipts")
