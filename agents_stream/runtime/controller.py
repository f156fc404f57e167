"""Execution controller (FLIP-425 style): per-key order, other keys concurrent, bounded.

* Key accounting: while a record of key K is in flight, later records of K wait in K's
  blocking buffer, in arrival order; records of other keys start at once.
* Reference counting: a record is finished when its work (and everything it awaited)
  completed; only then does the next record of its key start and its offset become
  committable.
* In-flight limit: ``in_flight`` counts running plus buffered records; the host stops
  taking input (pauses partitions) while ``has_capacity`` is false.
* Watermark epochs: each record joins the current epoch; :meth:`watermark` closes it and
  its callback runs only once every earlier record finished (see ``epochs.py``). In
  strict mode a record also waits for the epochs before its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from .epochs import Epoch, EpochManager, EpochMode

log = logging.getLogger("agents_stream.runtime")

Work = Callable[[], Awaitable[None]]


@dataclass
class _Pending:
    key: Hashable
    group: Hashable  # what drain() selects by, e.g. (topic, partition)
    work: Work
    done: Callable[[bool], None]  # called with True when finished, False when abandoned
    epoch: Epoch


class ExecutionController:
    def __init__(
        self, max_in_flight: int = 6000, *, epoch_mode: EpochMode = "out_of_order"
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self.epochs = EpochManager(epoch_mode)
        self._buffers: dict[Hashable, deque[_Pending]] = {}  # waiting records per key
        self._busy: set[Hashable] = set()  # keys with a running record
        self._blocked: dict[Hashable, None] = {}  # keys whose next record waits for an epoch
        self._running: dict[asyncio.Task[None], _Pending] = {}
        self._in_flight = 0
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.peak_in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def has_capacity(self) -> bool:
        return self._in_flight < self.max_in_flight

    @property
    def free_slots(self) -> int:
        return max(0, self.max_in_flight - self._in_flight)

    async def wait_for_capacity(self) -> None:
        await self._capacity.wait()

    def submit(
        self, key: Hashable, group: Hashable, work: Work, done: Callable[[bool], None]
    ) -> None:
        """Run ``work`` after every earlier record of ``key``; ``done`` reports the end."""
        item = _Pending(key, group, work, done, self.epochs.enter())
        self._in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        self._idle.clear()
        if self._in_flight >= self.max_in_flight:
            self._capacity.clear()
        self._buffers.setdefault(key, deque()).append(item)
        self._pump(key)

    def watermark(self, timestamp: int, process: Callable[[int], None]) -> None:
        """Close the current epoch; ``process(timestamp)`` runs once it has finished."""
        self.epochs.watermark(timestamp, process)
        self._unblock()

    def _pump(self, key: Hashable) -> None:
        if key in self._busy:
            return
        buffer = self._buffers.get(key)
        if not buffer:
            self._buffers.pop(key, None)
            return
        head = buffer[0]
        if not self.epochs.may_start(head.epoch):
            self._blocked[key] = None
            return
        buffer.popleft()
        self._busy.add(key)
        task = asyncio.get_running_loop().create_task(head.work())
        self._running[task] = head
        task.add_done_callback(self._finished)

    def _unblock(self) -> None:
        for key in list(self._blocked):
            self._blocked.pop(key, None)
            self._pump(key)

    def _finished(self, task: asyncio.Task[None]) -> None:
        item = self._running.pop(task)
        ok = not task.cancelled() and task.exception() is None
        if not task.cancelled() and task.exception() is not None:
            log.error("work for key %r crashed", item.key, exc_info=task.exception())
        self._busy.discard(item.key)
        self._release(item, ok)
        self._pump(item.key)

    def _release(self, item: _Pending, ok: bool) -> None:
        self._in_flight -= 1
        try:
            item.done(ok)
        finally:
            if self._in_flight < self.max_in_flight:
                self._capacity.set()
            if self._in_flight == 0:
                self._idle.set()
            self.epochs.leave(item.epoch)
            if self.epochs.mode == "strict":
                self._unblock()

    async def join(self) -> None:
        """Wait until every submitted record finished (buffered ones included)."""
        await self._idle.wait()

    async def drain(self, groups: set[Hashable] | None = None, timeout: float = 10.0) -> int:
        """Stop buffered work of ``groups`` (all when None), wait for its running work up
        to ``timeout``, then cancel the rest. Returns how many records were abandoned;
        abandoned records were not committed and replay from the journal later."""

        def selected(item: _Pending) -> bool:
            return groups is None or item.group in groups

        abandoned = 0
        for key in list(self._buffers):
            buffer = self._buffers.get(key)
            dropped = [i for i in buffer or () if selected(i)]
            if not dropped:
                continue
            self._buffers[key] = deque(i for i in buffer or () if not selected(i))
            for item in dropped:
                abandoned += 1
                self._release(item, False)
            self._pump(key)
        running = [t for t, i in self._running.items() if selected(i)]
        if running:
            _, pending = await asyncio.wait(running, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                abandoned += len(pending)
                await asyncio.wait(pending, timeout=1.0)
        return abandoned
