"""Zombie test app: two journaled calls per input, each start and each acknowledged result
recorded in an external SQLite ledger with the process id and wall time (the test counts
who ran what, and when, around a SIGSTOP)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(
    os.environ.get("AS_APP_ID", "zombie"),
    commit_interval=float(os.environ.get("AS_COMMIT_INTERVAL", "0.5")),
)
CALL_S = float(os.environ.get("AS_CALL_S", "0.05"))

_lock = threading.Lock()
_db: sqlite3.Connection | None = None


def ledger() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["AS_LEDGER"], timeout=60, isolation_level=None,
                         check_same_thread=False)  # fmt: skip
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=60000")
    db.execute(
        "CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY AUTOINCREMENT, "
        "what TEXT, pid INT, n INT, i INT, t REAL)"
    )
    return db


def count(db: sqlite3.Connection, what: str, pid: int) -> int:
    """For the tests: ledger rows ``what`` ("start", "acked") of process ``pid``."""
    try:
        row = db.execute("SELECT count(*) FROM calls WHERE what=? AND pid=?", (what, pid))
        return int(row.fetchone()[0])
    except sqlite3.OperationalError:  # the table is made by the first call
        return 0


def note(what: str, n: int, i: int) -> None:
    global _db
    with _lock:
        if _db is None:
            _db = ledger()
        _db.execute(
            "INSERT INTO calls(what, pid, n, i, t) VALUES (?, ?, ?, ?, ?)",
            (what, os.getpid(), n, i, time.time()),
        )


def call(n: int, i: int) -> int:
    note("start", n, i)  # the side effect: recorded when the code block starts
    time.sleep(CALL_S)
    return n * 10 + i


class Twice(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = event.input["n"]
        for i in range(2):
            ctx.execute(call, n, i)
            note("acked", n, i)  # after the CallResult was acknowledged
        # "t": when and where it was made (tests/fault/fleet.py reads outputs with it).
        ctx.send_event(OutputEvent(output={"n": n, "pid": os.getpid(), "t": time.time()}))


app.agent(
    Twice,
    input=os.environ.get("AS_INPUT", "zombie-in"),
    output=os.environ.get("AS_OUTPUT", "zombie-out"),
)
