"""Interpreter settings for a process that runs records: the worker and the benchmarks
that measure its path use the same ones.

* GIL switch interval 1 ms (default 5 ms): journal acks are resolved on the producer's
  thread, and the client takes the GIL once per delivery report; behind a busy event
  loop each report waited up to a switch interval, so ack latency under load rose from
  ~3 ms to 20-36 ms.
* Young-generation collection every ``GC_THRESHOLD`` allocations (default 700): each
  record allocates a few dozen objects that live for its ack round trips; the default
  collector ran every few records and its full passes over thousands of records in
  flight took a quarter of a 1-call drain (3.6 s of ~12 s), holding the GIL meanwhile.
  Objects that live as long as the process (app, clients, caches) are frozen out of
  full passes with :func:`freeze_startup`.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_INTERVAL = 0.001  # seconds
GC_THRESHOLD = 50_000  # allocations between young-generation collections


@contextmanager
def record_processing() -> Iterator[None]:
    """Apply the settings for the duration of the block; restore them after."""
    interval = sys.getswitchinterval()
    thresholds = gc.get_threshold()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    gc.set_threshold(max(thresholds[0], GC_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def freeze_startup() -> None:
    """Everything allocated so far lives as long as the process: no full GC pass needs
    to look at it again."""
    gc.freeze()
