"""Two-phase test app: an order authorises a hold (prepare), captures it once the
record's completion is durable (commit) or releases it (abort), against an external
ledger (a SQLite file shared by the test and the worker processes, ``AS_LEDGER``).

The ledger keeps every attempt (``attempts``: what, hold, pid, id order) and each hold's
end state (``holds``): a hold captured after a release, or released after a capture, is
recorded as a violation, whoever did it. Latches (``AS_LATCH_DIR``, tests/apps/effects.py):
``park-prepared-<order>`` parks the action after its prepare returned (journaled and
acknowledged), ``park-commit`` parks the first process whose commit starts (before it
captures), ``park-abort`` the first abort. With ``AS_CHECK_OUTPUT`` a commit first reads
the output topic (read_committed, ``AS_BOOTSTRAP``) and records a violation unless the
order's output is there: a capture before the record's completion was durable.
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
    RunnerContext,
    TwoPhaseCommitCallable,
    action,
)
from tests.apps.effects import park

app = App(
    os.environ.get("AS_APP_ID", "two-phase"),
    commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.3")),
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, what TEXT, hold TEXT, orders TEXT, pid INT, t REAL
);
CREATE TABLE IF NOT EXISTS holds (hold TEXT PRIMARY KEY, orders TEXT, state TEXT);
CREATE TABLE IF NOT EXISTS violations (what TEXT, hold TEXT, pid INT);
"""

_lock = threading.Lock()
_db: sqlite3.Connection | None = None


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=60000")
    db.executescript(SCHEMA)
    return db


def _ledger() -> sqlite3.Connection:
    global _db
    if _db is None:
        _db = connect(os.environ["AS_LEDGER"])
    return _db


def _note(what: str, hold: str, order: str) -> None:
    _ledger().execute(
        "INSERT INTO attempts(what, hold, orders, pid, t) VALUES (?, ?, ?, ?, ?)",
        (what, hold, order, os.getpid(), time.time()),
    )


def _park_once(point: str) -> None:
    """Park (forever) the first process that gets here, if the test armed ``point``."""
    latch = os.environ.get("AS_LATCH_DIR")
    if not latch:
        return
    armed, parked = Path(latch, f"park-{point}"), Path(latch, f"parked-{point}")
    if armed.exists() and not parked.exists():
        parked.write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)


def _fixed() -> bool:
    """The test touched ``fixed`` in the latch dir: failing orders go through (a fix
    deployed before their dead letters are replayed)."""
    latch = os.environ.get("AS_LATCH_DIR")
    return bool(latch) and Path(latch, "fixed").exists()


@dataclass
class Charge(TwoPhaseCommitCallable[dict]):
    order: str
    cents: int

    def prepare(self, call_id: str) -> dict:
        with _lock:
            _note("hold", call_id, self.order)
            _ledger().execute(
                "INSERT OR IGNORE INTO holds(hold, orders, state) VALUES (?, ?, 'HELD')",
                (call_id, self.order),
            )
        return {"hold": call_id, "cents": self.cents}

    def commit(self, prepared: dict) -> None:
        _park_once("commit")
        if os.environ.get("AS_CHECK_OUTPUT"):
            self._check_output(prepared["hold"])
        self._end(prepared["hold"], "CAPTURED", "RELEASED")
        delay = float(os.environ.get("AS_COMMIT_S", "0"))
        if delay:
            time.sleep(delay)

    def abort(self, prepared: dict) -> None:
        _park_once("abort")
        self._end(prepared["hold"], "RELEASED", "CAPTURED")

    def _check_output(self, hold: str) -> None:
        """The record's completion must be durable before its capture: its output is
        in the output topic, visible to a read_committed reader, by now."""
        from agents_stream.testing.topics import read_topic

        outputs = read_topic(os.environ["AS_BOOTSTRAP"], os.environ["AS_OUTPUT"], timeout=20)
        if not any(r.json().get("hold") == hold for r in outputs):
            with _lock:
                _ledger().execute(
                    "INSERT INTO violations VALUES (?, ?, ?)",
                    ("captured before its output was durable", hold, os.getpid()),
                )

    def _end(self, hold: str, state: str, opposite: str) -> None:
        with _lock:
            _note("capture" if state == "CAPTURED" else "release", hold, self.order)
            db = _ledger()
            row = db.execute("SELECT state FROM holds WHERE hold = ?", (hold,)).fetchone()
            if row is not None and row[0] == opposite:
                db.execute(
                    "INSERT INTO violations VALUES (?, ?, ?)",
                    (f"{state} after {opposite}", hold, os.getpid()),
                )
            db.execute("UPDATE holds SET state = ? WHERE hold = ?", (state, hold))


class Orders(Agent):
    @action(InputEvent)
    @staticmethod
    def pay(event: InputEvent, ctx: RunnerContext) -> None:
        order = event.input["order"]
        held = ctx.execute(Charge(order, int(event.input.get("cents", 100))))
        park(f"prepared-{order}")
        if event.input.get("fail") and not _fixed():
            raise RuntimeError(f"order {order} refused after its hold")
        ctx.send_event(OutputEvent(output={"order": order, "hold": held["hold"]}))


app.agent(
    Orders,
    input=os.environ.get("AS_INPUT", "two-phase-in"),
    output=os.environ.get("AS_OUTPUT", "two-phase-out"),
)
