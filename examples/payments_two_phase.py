"""Payments with a two-phase charge: authorise a hold when the order comes in, capture it
only once the order's processing is durable, release it if the order is refused.

Run it:  agents-stream worker -A examples.payments_two_phase:app
Feed it: JSON values like {"order": "o-1", "customer": "c-7", "amount": 42.5} on
         "orders", keyed by customer; receipts appear on "receipts". An order over the
         customer's limit (100 by default) is refused after its hold: the record goes to
         "orders-dlq" and the hold is released.

The payment provider is a SQLite file ($PAYMENTS_LEDGER, default
.agents-stream/holds.sqlite) that outlives the worker. Each hold carries the call id as
its idempotency key, so an authorisation repeated after a crash (before its result was
journaled) finds the same hold, and a capture or release repeated after a crash changes
nothing: what ``commit`` and ``abort`` must be.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agents_stream import (
    Agent,
    App,
    InputEvent,
    OutputEvent,
    RetryPolicy,
    RunnerContext,
    TwoPhaseCommitCallable,
    action,
)

app = App("payments-2pc")
LIMIT = float(os.environ.get("PAYMENTS_LIMIT", "100"))


class HoldProvider:
    """A stand-in for a card processor's authorise / capture / release API."""

    SCHEMA = """
    CREATE TABLE IF NOT EXISTS holds (
        hold TEXT PRIMARY KEY, customer TEXT, amount REAL, state TEXT, at REAL
    );
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get(
            "PAYMENTS_LEDGER", str(Path(".agents-stream") / "holds.sqlite")
        )
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA busy_timeout=30000")
            db.executescript(self.SCHEMA)
            self._db = db
        return self._db

    def authorize(self, key: str, customer: str, amount: float) -> str:
        with self._lock:  # idempotent on the key: a repeat returns the same hold
            self._conn().execute(
                "INSERT OR IGNORE INTO holds VALUES (?, ?, ?, 'AUTHORIZED', ?)",
                (key, customer, amount, time.time()),
            )
        return key

    def _settle(self, hold: str, state: str) -> None:
        with self._lock:  # idempotent: settling a settled hold the same way is a no-op
            row = self._conn().execute("SELECT state FROM holds WHERE hold = ?", (hold,))
            found = row.fetchone()
            if found is not None and found[0] not in ("AUTHORIZED", state):
                raise RuntimeError(f"hold {hold} is {found[0]}, cannot be {state}")
            self._conn().execute("UPDATE holds SET state = ? WHERE hold = ?", (state, hold))

    def capture(self, hold: str) -> None:
        self._settle(hold, "CAPTURED")

    def release(self, hold: str) -> None:
        self._settle(hold, "RELEASED")

    def states(self) -> dict[str, str]:
        with self._lock:
            return dict(self._conn().execute("SELECT hold, state FROM holds").fetchall())


PROVIDER = HoldProvider()


@dataclass
class Charge(TwoPhaseCommitCallable[dict]):
    """The hold is the preparation; capture and release are its commit and abort."""

    customer: str
    amount: float

    def prepare(self, call_id: str) -> dict:
        return {"hold": PROVIDER.authorize(call_id, self.customer, self.amount)}

    def commit(self, prepared: dict) -> None:
        PROVIDER.capture(prepared["hold"])

    def abort(self, prepared: dict) -> None:
        PROVIDER.release(prepared["hold"])


class LimitExceeded(Exception):
    pass


class Payments(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        order = event.input
        held = ctx.execute(
            Charge(order["customer"], order["amount"]),
            retry=RetryPolicy(max_attempts=3, retry_on=(sqlite3.OperationalError,)),
        )
        total = ctx.short_term_memory.get("total", 0.0) + order["amount"]
        if total > LIMIT:
            # Refused after the hold: dead-lettered, and the hold is released.
            raise LimitExceeded(f"{order['customer']} would be at {total} (limit {LIMIT})")
        ctx.short_term_memory.set("total", round(total, 2))
        ctx.send_event(OutputEvent(output={**order, "hold": held["hold"], "customer_total": total}))


app.agent(Payments, input="orders", output="receipts")
