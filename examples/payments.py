"""Payments agent: score an order's fraud risk (slow API), charge it (side effect that
must never happen twice), keep a running total per customer, emit a receipt.

Run it:  agents-stream worker -A examples.payments:app
Feed it: JSON values like {"order": "o-1", "customer": "c-7", "amount": 42.5} on "orders",
         keyed by customer; receipts appear on "receipts".

The payment provider is a SQLite file ($PAYMENTS_LEDGER, default
.agents-stream/payments-ledger.sqlite): it outlives the worker, as a real provider
does, so after a crash mid-charge the reconciler can find the charge that went through
(`make demo-crash` shows it).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sqlite3
import threading
import time
from pathlib import Path

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



class Provider:
    """A stand-in for the payment provider. Charges carry the idempotency key (the
    call id), as with Stripe or Adyen, so the reconciler can ask "did this charge go
    through?". Every charge attempt is a row: a double charge would show as two rows."""

    SCHEMA = """
    CREATE TABLE IF NOT EXISTS charges (
        id INTEGER PRIMARY KEY AUTOINCREMENT, call_id TEXT, customer TEXT, amount REAL,
        pid INT, at REAL
    );
    CREATE TABLE IF NOT EXISTS reconciles (call_id TEXT, found INT, pid INT, at REAL);
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get(
            "PAYMENTS_LEDGER", str(Path(".agents-stream") / "payments-ledger.sqlite")
        )
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # code blocks run on several pool threads

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(self.SCHEMA)
            self._db = db
        return self._db

    def charge(self, call_id: str, customer: str, amount: float) -> None:
        with self._lock:
            self._conn().execute(
                "INSERT INTO charges(call_id, customer, amount, pid, at) VALUES (?, ?, ?, ?, ?)",
                (call_id, customer, amount, os.getpid(), time.time()),
            )

    def find(self, call_id: str) -> float | None:
        with self._lock:
            row = (
                self._conn()
                .execute("SELECT amount FROM charges WHERE call_id = ?", (call_id,))
                .fetchone()
            )
            self._conn().execute(
                "INSERT INTO reconciles VALUES (?, ?, ?, ?)",
                (call_id, row is not None, os.getpid(), time.time()),
            )
        return None if row is None else float(row[0])


PROVIDER = Provider()


def _crash_point(name: str) -> None:
    """`make demo-crash` arms a latch file here, then SIGKILLs the parked worker."""
    latch = os.environ.get("PAYMENTS_CRASH_LATCH")
    if latch and Path(latch, f"park-{name}").exists():
        Path(latch, f"parked-{name}").write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)


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
        PROVIDER.charge(call_id, customer, amount)
        _crash_point("charge")  # the money moved; the result is not journaled yet
        return {"charge_id": call_id, "amount": amount}

    def reconciler(self, call_id: str, customer: str, amount: float) -> dict:
        charged = PROVIDER.find(call_id)
        if charged is not None:
            return {"charge_id": call_id, "amount": charged}
        # The crash came before the provider saw the charge: charging now is the first
        # time (and a crash during it is found by the next reconcile).
        PROVIDER.charge(call_id, customer, amount)
        return {"charge_id": call_id, "amount": amount}


class Payments(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        order = event.input
        risk = await ctx.execute_async(fraud_score, order)
        if risk > 0.9:
            ctx.send_event(OutputEvent(output={**order, "status": "rejected", "risk": risk}))
            return
        # Awaited: the charge runs in the code-block pool while other orders go on (a
        # plain ctx.execute here would hold the event loop for the whole call).
        charge = await ctx.execute_async(
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
