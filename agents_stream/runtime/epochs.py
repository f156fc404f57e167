"""Watermark epochs (FLIP-425): a watermark is processed only after every record that
arrived before it has finished.

Records arriving between two watermarks form an *epoch*. A watermark closes the current
epoch and is processed (its callback fires: event-time timers up to it, downstream
propagation) once that epoch and every earlier one have no unfinished record; watermarks
therefore fire in arrival order, never before the records they follow.

Modes:
  * ``"out_of_order"`` (default): records of a later epoch may start while an earlier
    epoch is still finishing; only watermarks wait.
  * ``"strict"``: a record of a later epoch does not start until every earlier epoch is
    complete and its watermark processed (records never overtake a watermark).

A watermark goes through two steps: it is *triggered* once its epoch and every earlier
one have no unfinished record (its callbacks run and may fire timers), and *emitted*
once the work its callbacks started has finished too. Work entered while a callback
runs belongs to the watermark's epoch, not to the open one: the timers a watermark
fires are records of that epoch, so the next watermark waits for them and, in strict
mode, later records do not start before them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

EpochMode = Literal["out_of_order", "strict"]

log = logging.getLogger("agents_stream.runtime")


@dataclass
class Epoch:
    id: int
    unfinished: int = 0
    watermark: int | None = None  # set when the epoch is closed by a watermark
    on_close: list[Callable[[int], None]] = field(default_factory=list)
    triggered: bool = False  # callbacks ran; emitted once ``unfinished`` is 0 again


class EpochManager:
    def __init__(self, mode: EpochMode = "out_of_order") -> None:
        if mode not in ("out_of_order", "strict"):
            raise ValueError(f"unknown epoch mode {mode!r}")
        self.mode = mode
        self.current = Epoch(0)  # the open epoch: the last of ``_epochs``
        self._epochs: deque[Epoch] = deque([self.current])
        self._next_id = 1
        self.processed_watermark: int | None = None  # the last emitted watermark
        self._triggering: Epoch | None = None
        # True while one epoch is open and no callback runs: then entering is adding one
        # to ``current.unfinished`` and leaving is taking it away, nothing else to do.
        # The controller does it inline for every record of an app without watermarks.
        self.quiet = True

    def enter(self) -> Epoch:
        """A record arrived: it belongs to the current (open) epoch, unless a watermark
        callback is running: then it is work of that watermark (a timer it fires)."""
        epoch = self._triggering or self.current
        epoch.unfinished += 1
        return epoch

    def leave(self, epoch: Epoch) -> None:
        """A record of ``epoch`` finished (or was abandoned)."""
        epoch.unfinished -= 1
        self._fire_ready()

    def may_start(self, epoch: Epoch) -> bool:
        """Strict mode: only records of the oldest unprocessed epoch may run."""
        return self.mode == "out_of_order" or epoch is self._epochs[0]

    def watermark(self, timestamp: int, process: Callable[[int], None]) -> None:
        """Close the current epoch with ``timestamp``; ``process`` runs once it is due."""
        epoch = self.current
        epoch.watermark = timestamp
        epoch.on_close.append(process)
        self.current = Epoch(self._next_id)
        self._epochs.append(self.current)
        self._next_id += 1
        self.quiet = False
        self._fire_ready()

    def pending_watermarks(self) -> int:
        return sum(1 for e in self._epochs if e.watermark is not None)

    def _fire_ready(self) -> None:
        if self._triggering is not None:
            return  # re-entered from a callback; the outer loop re-checks when it returns
        while len(self._epochs) > 1:
            oldest = self._epochs[0]
            if oldest.unfinished > 0 or oldest.watermark is None:
                return
            if not oldest.triggered:
                self._trigger(oldest)
                continue  # the work it entered (if any) now keeps it open
            self._epochs.popleft()
            self.processed_watermark = oldest.watermark
        self.quiet = len(self._epochs) == 1

    def _trigger(self, epoch: Epoch) -> None:
        assert epoch.watermark is not None
        epoch.triggered = True
        self._triggering = epoch
        self.quiet = False
        try:
            for process in epoch.on_close:
                try:
                    process(epoch.watermark)
                except Exception:  # one bad callback must not stop event time for good
                    log.exception("watermark %d callback failed", epoch.watermark)
        finally:
            self._triggering = None
