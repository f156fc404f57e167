"""Interpreter settings for a process that runs records: the worker and the benchmarks
that measure its path use the same ones.

* GIL switch interval 200 us (Python's default 5 ms; ``AGENTS_STREAM_GIL_SWITCH_US``):
  while the event loop is busy, every other thread on a record's path (the Kafka thread,
  code-block threads; the producer's poll thread where a host keeps one: the worker's
  loop serves delivery reports itself) waits up to one interval for the GIL each time it
  needs it. Since the loop serves the reports, 200 us / 1 ms / 5 ms drained a 1-call
  backlog alike (three interleaved rounds, within the noise). Measured with ``bench_journal.py`` (500
  records in flight), journal ack latency p50 / p99 under load: 9.2-19 / 11-36 ms at
  1 ms, 3.5-7.7 / 8-23 ms at 200 us, 3.6-4.3 / 7-13 ms at 50 us (idle: 2.5 ms). Shorter
  intervals cost throughput (smaller bursts of acks per switch, more switches): against
  1 ms, a backlog drain measured 0.94-0.98x at 200 us, 0.92-0.94x at 100 us and
  0.88-0.96x at 50 us (``bench/ab_worker.py``). 200 us meets the ack latency goals of
  issue 13 for most of the throughput; raise it where a drain's throughput matters more
  than the latency of journaled calls under load.
* Young-generation collection every ``GC_THRESHOLD`` allocations (default 700): each
  record allocates a few dozen objects that live for its ack round trips; the default
  collector ran every few records and its full passes over thousands of records in
  flight took a quarter of a 1-call drain (3.6 s of ~12 s), holding the GIL meanwhile.
  Objects that live as long as the process (app, clients, caches) are frozen out of
  full passes with :func:`freeze_startup`.
* The event loop is uvloop's where it is installed (a dependency on Linux and macOS):
  its handles, futures and wake-ups are C, and a backlog drain measured 1.05-1.08x the
  events/s of asyncio's own loop (CPU per record 6-8 % lower; ``bench/ab_worker.py``).
  ``AGENTS_STREAM_EVENT_LOOP=asyncio`` runs the stock loop.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ..errors import ConfigurationError

T = TypeVar("T")

SWITCH_ENV = "AGENTS_STREAM_GIL_SWITCH_US"
LOOP_ENV = "AGENTS_STREAM_EVENT_LOOP"
DEFAULT_SWITCH_US = 200
GC_THRESHOLD = 50_000  # allocations between young-generation collections


def switch_interval() -> float | None:
    """The GIL switch interval ``AGENTS_STREAM_GIL_SWITCH_US`` asks for, in seconds; None
    when it is not set (the default applies, unless the process already switches more
    often). A value that is not a number of microseconds from 10 to 100,000 is refused
    at start, naming the variable."""
    raw = os.environ.get(SWITCH_ENV, "").strip()
    if not raw:
        return None
    try:
        micros = float(raw)
    except ValueError:
        micros = float("nan")
    if not 10 <= micros <= 100_000:
        raise ConfigurationError(
            f"{SWITCH_ENV}={raw!r}: expected the GIL switch interval in microseconds, "
            f"10 to 100000 (default {DEFAULT_SWITCH_US})"
        )
    return micros / 1e6


@contextmanager
def record_processing() -> Iterator[None]:
    """Apply the settings for the duration of the block; restore them after."""
    asked = switch_interval()
    interval = sys.getswitchinterval()
    thresholds = gc.get_threshold()
    if asked is None:
        sys.setswitchinterval(min(interval, DEFAULT_SWITCH_US / 1e6))
    else:
        sys.setswitchinterval(asked)
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


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop if installed, unless ``AGENTS_STREAM_EVENT_LOOP=asyncio``; None for
    asyncio's default. Any other value is refused, naming the variable."""
    choice = os.environ.get(LOOP_ENV, "").strip().lower()
    if choice not in ("", "uvloop", "asyncio"):
        raise ConfigurationError(f"{LOOP_ENV}={choice!r}: expected 'uvloop' or 'asyncio'")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigurationError(
                f"{LOOP_ENV}=uvloop but uvloop is not installed (pip install uvloop)"
            ) from None
        return None
    return uvloop.new_event_loop


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
