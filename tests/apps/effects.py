"""External side effects counted in a SQLite file shared by test and worker processes.

``effect`` rows are written *inside* code blocks (the side effect); ``acked`` rows are
written by the action after ``ctx.execute`` returned, i.e. after the CallResult was
acknowledged. Both share one id sequence, so an effect row with a larger id than an acked
row of the same call id is an acknowledged call executed again: what guarantee 1 forbids.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    id INTEGER PRIMARY KEY AUTOINCREMENT, what TEXT, kind TEXT, call_id TEXT, pid INT
);
CREATE VIEW IF NOT EXISTS effects AS SELECT * FROM log WHERE what = 'effect';
CREATE VIEW IF NOT EXISTS acked AS SELECT * FROM log WHERE what = 'acked';
"""


def connect(path: str | None = None) -> sqlite3.Connection:
    db = sqlite3.connect(
        path or os.environ["AS_EFFECTS_DB"],
        timeout=60,
        isolation_level=None,
        check_same_thread=False,
    )
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    return db


_conn: tuple[str, sqlite3.Connection] | None = None
_LOCK = threading.Lock()  # one connection per process, shared by action threads


def _db() -> sqlite3.Connection:
    # Keyed by the path: in-process workers of successive tests (one pytest process)
    # each point AS_EFFECTS_DB at their own file.
    global _conn
    path = os.environ["AS_EFFECTS_DB"]
    if _conn is None or _conn[0] != path:
        if _conn is not None:
            _conn[1].close()
        _conn = (path, connect(path))
        _conn[1].execute("PRAGMA busy_timeout=60000")
    return _conn[1]


def effect(kind: str, call_id: str) -> None:
    with _LOCK:
        _db().execute(
            "INSERT INTO log(what, kind, call_id, pid) VALUES ('effect', ?, ?, ?)",
            (kind, call_id, os.getpid()),
        )


def acked(call_id: str) -> None:
    with _LOCK:
        _db().execute(
            "INSERT INTO log(what, call_id, pid) VALUES ('acked', ?, ?)", (call_id, os.getpid())
        )


def has_effect(call_id: str) -> bool:
    with _LOCK:
        row = (
            _db()
            .execute("SELECT 1 FROM effects WHERE call_id = ? AND kind != 'reconcile'", (call_id,))
            .fetchone()
        )
    return row is not None


def park(point: str) -> None:
    """Block forever if the test armed latch ``point``; tell the test we are parked."""
    latch = os.environ.get("AS_LATCH_DIR")
    if not latch or not Path(latch, f"park-{point}").exists():
        return
    Path(latch, f"parked-{point}").write_text(str(os.getpid()))
    while True:
        time.sleep(0.05)


REEXECUTED_AFTER_ACK = """
SELECT COUNT(DISTINCT e.call_id) FROM effects e
JOIN acked a ON a.call_id = e.call_id AND e.id > a.id
"""
