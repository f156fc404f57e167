"""Fault points: named places between two writes of the record path where the fault
tests stop a worker, to SIGKILL it there (tests/fault/test_write_points.py).

Off unless ``AGENTS_STREAM_FAULT_POINTS`` names points (comma-separated) and
``AGENTS_STREAM_FAULT_DIR`` a directory: then the first thread to reach a named point
writes ``<dir>/parked-<point>`` (its pid) and blocks for good, holding whatever it holds
(the loop, the Kafka thread), for the test to kill the process. Read once at import; a
caller tests :data:`POINTS` first, so a point costs one global lookup when off.

Points: ``outputs`` (a group's completion acknowledged, its outputs not produced yet),
``commit`` (records finished, their outputs acknowledged, the offsets and markers not
written), ``prune`` (offsets and markers durable, the journal not pruned).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

POINTS = frozenset(p for p in os.environ.get("AGENTS_STREAM_FAULT_POINTS", "").split(",") if p)


def reached(point: str) -> None:
    """Block forever if ``point`` is armed (see the module docstring)."""
    if point not in POINTS:
        return
    folder = os.environ.get("AGENTS_STREAM_FAULT_DIR")
    if not folder:
        return
    Path(folder, f"parked-{point}").write_text(str(os.getpid()))
    while True:
        time.sleep(1)
