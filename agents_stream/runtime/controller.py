"""Execution controller (FLIP-425 style): per-key order, other keys concurrent, bounded.

Timer firings are records here: they take the same path as input records (the host
submits them under their key), so everything below holds for them too.

* Key accounting: while a record of key K is in flight, later records of K wait in K's
  blocking buffer; records of other keys start at once. The buffer is in epoch order,
  arrival order within an epoch: a timer fired by a watermark goes before the records
  that arrived after that watermark.
* Reference counting: a record is finished when its work (and everything it awaited)
  completed; only then does the next record of its key start and its offset become
  committable.
* In-flight limit: ``in_flight`` counts admitted records (running plus key-buffered) and
  never exceeds ``max_in_flight``. Submitted beyond it (a watermark may fire many timers
  at once), records wait for admission in epoch order; meanwhile ``has_capacity`` is
  false, so the host stops taking input (pauses partitions).
* Watermark epochs: each record joins the current epoch; :meth:`watermark` closes it and
  its callback runs only once every earlier record finished; records submitted by that
  callback (its timers) belong to the closed epoch, so the next watermark waits for
  them (see ``epochs.py``). In strict mode a record also waits for the epochs before its
  own.
* Quiescence: :meth:`join` returns when nothing is admitted, waiting or running;
  :meth:`drain` returns when nothing of its groups is, and refuses (abandons) records of
  those groups submitted while it runs.
* A raising ``done`` callback is logged; its key goes on.
* Lanes: a record submitted to a :class:`Lane` (``submit_to``) is started like any
  other (its key free, its epoch allowed, admitted), but instead of a task of its own
  it is handed to its lane, with the lane's other records started in the same loop
  iteration, in one ``lane.start(records)``. The lane reports each record's end with
  :meth:`ExecutionController.finished` (several at once) and may free its key earlier
  with :meth:`ExecutionController.released`: the next record of the key starts while
  this one stays in flight (not committable, its epoch open) until it is finished. The
  worker's agents release a record once its ActionDone is acked and its outputs are
  sent: what the next record does can no longer reorder or change them. A drain stops
  the lanes whose records outlive its timeout and abandons what they did not report.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Hashable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..durable.lane import cancel_all
from ..durable.ownership import OwnershipLost
from .epochs import Epoch, EpochManager, EpochMode

log = logging.getLogger("agents_stream.runtime")

Work = Callable[[], Coroutine[Any, Any, None]]


class Lane(Protocol):
    """Runs records the controller starts, one group's (e.g. one partition's): each is
    reported once through :meth:`ExecutionController.finished`."""

    def start(self, records: list[Admitted]) -> None:
        """Start ``records`` (distinct keys); report none of them from inside the call."""

    async def stop(self) -> None:
        """Stop what runs (a drain); report nothing more. Unreported records are
        abandoned by the controller."""


class Admitted:
    """A submitted record, as the controller keeps it and a lane reports it."""

    __slots__ = ("done", "epoch", "group", "key", "lane", "payload", "released", "work")

    def __init__(
        self,
        key: Hashable,
        group: Hashable,
        work: Work | None,
        lane: Lane | None,
        payload: Any,
        done: Callable[[bool], None],
        epoch: Epoch,
    ) -> None:
        self.key = key
        self.group = group  # what drain() selects by, e.g. (topic, partition)
        self.work = work  # a task runs it, or:
        self.lane = lane  # the lane runs it
        self.payload = payload  # what the lane runs
        self.done = done  # called with True when finished, False when abandoned
        self.epoch = epoch
        self.released = False  # its key is free already (a lane said so)


@dataclass
class _Drain:
    groups: set[Hashable] | None  # None: every group
    abandoned: int = 0
    quiet: asyncio.Future[None] | None = None  # set once no lane record of it is open

    def selects(self, item: Admitted) -> bool:
        return self.groups is None or item.group in self.groups


@dataclass(order=True)
class _Waiting:
    epoch_id: int
    arrival: int
    item: Admitted = field(compare=False)


class ExecutionController:
    def __init__(
        self, max_in_flight: int = 6000, *, epoch_mode: EpochMode = "out_of_order"
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self.epochs = EpochManager(epoch_mode)
        self._strict = epoch_mode == "strict"
        self._buffers: dict[Hashable, deque[Admitted]] = {}  # waiting records per key
        self._busy: set[Hashable] = set()  # keys with a running record
        self._blocked: dict[Hashable, None] = {}  # keys whose next record waits for an epoch
        self._running: dict[asyncio.Task[None], Admitted] = {}
        self._open: set[Admitted] = set()  # handed to their lane, not finished
        self._ready: dict[Lane, list[Admitted]] = {}  # started, not handed to their lane
        self._handing = False  # a _hand_over call is scheduled
        self._waiting: list[_Waiting] = []  # not admitted yet (limit reached), a heap
        self._arrivals = itertools.count()
        self._drains: list[_Drain] = []
        self._in_flight = 0
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._room: list[tuple[int, asyncio.Future[None]]] = []  # wait_for_slots
        self.peak_in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Records submitted beyond the in-flight limit, not admitted yet."""
        return len(self._waiting)

    @property
    def has_capacity(self) -> bool:
        return not self._waiting and self._in_flight < self.max_in_flight

    @property
    def free_slots(self) -> int:
        return max(0, self.max_in_flight - self._in_flight) if not self._waiting else 0

    async def wait_for_capacity(self) -> None:
        await self._capacity.wait()

    async def wait_for_slots(self, slots: int) -> None:
        """Return once at least ``slots`` records can be admitted (or none is in flight)."""
        while self.free_slots < slots and self._in_flight:
            waiter = asyncio.get_running_loop().create_future()
            self._room.append((slots, waiter))
            await waiter

    def submit(
        self, key: Hashable, group: Hashable, work: Work, done: Callable[[bool], None]
    ) -> None:
        """Run ``work`` after every earlier record of ``key``; ``done`` reports the end.

        Called from a watermark callback, the record belongs to that watermark's epoch.
        A record of a group being drained is abandoned at once (``done(False)``).
        """
        self._submit(key, group, work, None, None, done)

    def submit_to(
        self,
        lane: Lane,
        key: Hashable,
        group: Hashable,
        payload: Any,
        done: Callable[[bool], None],
    ) -> None:
        """:meth:`submit`, the record run by ``lane`` (``payload`` is what it runs)."""
        self._submit(key, group, None, lane, payload, done)

    def _submit(
        self,
        key: Hashable,
        group: Hashable,
        work: Work | None,
        lane: Lane | None,
        payload: Any,
        done: Callable[[bool], None],
    ) -> None:
        epochs = self.epochs
        if epochs.quiet:  # no watermark pending: EpochManager.enter, inline
            epoch = epochs.current
            epoch.unfinished += 1
        else:
            epoch = epochs.enter()
        item = Admitted(key, group, work, lane, payload, done, epoch)
        self._idle.clear()
        drain = self._draining(item) if self._drains else None
        if drain is not None:
            drain.abandoned += 1
            self._release(item, False, admitted=False)
        elif self._waiting or self._in_flight >= self.max_in_flight:
            heapq.heappush(self._waiting, _Waiting(item.epoch.id, next(self._arrivals), item))
            self._capacity.clear()
        else:
            self._admit(item)

    def watermark(self, timestamp: int, process: Callable[[int], None]) -> None:
        """Close the current epoch; ``process(timestamp)`` runs once it has finished, and
        the records it submits (the timers it fires) belong to the closed epoch."""
        self.epochs.watermark(timestamp, process)
        self._unblock()

    def _admit(self, item: Admitted) -> None:
        in_flight = self._in_flight = self._in_flight + 1
        if in_flight > self.peak_in_flight:
            self.peak_in_flight = in_flight
        if in_flight >= self.max_in_flight:
            self._capacity.clear()
        key = item.key
        buffers = self._buffers
        if key not in buffers and key not in self._busy and not self._strict and not self._drains:
            # Its key is idle (most records): started at once, no buffer made. While a
            # drain runs, _pump decides (a waiting record admitted now may be of its
            # group).
            self._start(item)
            return
        buffer = buffers.get(key)
        if buffer is None:  # not setdefault: that builds a deque per record
            buffer = buffers[key] = deque()
        # Epoch order first: a timer of an older epoch must not wait behind records that
        # (in strict mode) cannot start before its watermark is emitted.
        position = len(buffer)
        while position > 0 and buffer[position - 1].epoch.id > item.epoch.id:
            position -= 1
        buffer.insert(position, item)
        self._pump(item.key)

    def _admit_waiting(self) -> None:
        while self._waiting and self._in_flight < self.max_in_flight:
            self._admit(heapq.heappop(self._waiting).item)

    def _pump(self, key: Hashable) -> None:
        if key not in self._buffers:  # nothing waits for the key (most records)
            return
        while True:
            if key in self._busy:
                return
            buffer = self._buffers.get(key)
            if not buffer:
                self._buffers.pop(key, None)
                return
            head = buffer[0]
            if self._strict and not self.epochs.may_start(head.epoch):
                self._blocked[key] = None
                return
            buffer.popleft()
            drain = self._draining(head) if self._drains else None
            if drain is None:
                break
            # A drain is under way for its group: abandoned, never started. Releasing
            # a drained record (or admitting a waiting one) pumps its key, and the drain
            # may not have to wait for anything after that, so this is the last point
            # where a record of a drained group could still slip into a batch.
            drain.abandoned += 1
            self._release(head, False)
        self._start(head)

    def _start(self, head: Admitted) -> None:
        """Run ``head`` now: its key is free and its epoch allowed (see _pump)."""
        self._busy.add(head.key)
        lane = head.lane
        if lane is not None:
            if lane in self._ready:
                self._ready[lane].append(head)
            else:
                self._ready[lane] = [head]
            if not self._handing:
                self._handing = True
                asyncio.get_running_loop().call_soon(self._hand_over)
            return
        task = asyncio.get_running_loop().create_task(head.work())  # type: ignore[misc]
        self._running[task] = head
        task.add_done_callback(self._finished)

    def _draining(self, item: Admitted) -> _Drain | None:
        drains = self._drains
        return next((d for d in drains if d.selects(item)), None) if drains else None

    def _hand_over(self) -> None:
        """The records started since the last call, to their lanes: one call per lane."""
        self._handing = False
        ready, self._ready = self._ready, {}
        for lane, items in ready.items():
            if self._drains:  # started before a drain of their group began: abandoned
                kept = []
                for item in items:
                    drain = self._draining(item)
                    if drain is None:
                        kept.append(item)
                        continue
                    drain.abandoned += 1
                    self._busy.discard(item.key)
                    self._release(item, False)
                    self._pump(item.key)
                if not (items := kept):
                    continue
            self._open.update(items)
            try:
                lane.start(items)
            except Exception:
                log.exception("a lane refused %d records", len(items))
                self.finished(items, False)

    def finished(self, items: list[Admitted], ok: bool) -> None:
        """A lane's records ended: finished (``ok``) or not (never committed). Each is
        released and its key pumped in order, what depends only on the totals
        (admission, capacity, idleness) once; a second report is ignored."""
        is_open, busy, buffers = self._open, self._busy, self._buffers
        for item in items:
            if item not in is_open:
                continue
            is_open.discard(item)
            if item.released:  # its key may run the next record already
                self._release(item, ok, settle=False)
                continue
            key = item.key
            busy.discard(key)
            self._release(item, ok, settle=False)
            if key in buffers:  # _pump's own first check: most keys have nothing waiting
                self._pump(key)
        self._settle()
        if self._drains:
            self._quieted()

    def released(self, items: list[Admitted]) -> None:
        """These lane records' keys are free: the next record of each may start, while
        these stay in flight until :meth:`finished`."""
        is_open, buffers = self._open, self._buffers
        for item in items:
            if item.released or item not in is_open:
                continue
            item.released = True
            key = item.key
            self._busy.discard(key)
            if key in buffers:  # see finished
                self._pump(key)

    def _quieted(self) -> None:
        """Wake the drains none of whose lane records is open any more."""
        for drain in self._drains:
            quiet = drain.quiet
            if (
                quiet is not None
                and not quiet.done()
                and not any(drain.selects(item) for item in self._open)
            ):
                quiet.set_result(None)

    def _unblock(self) -> None:
        for key in list(self._blocked):
            self._blocked.pop(key, None)
            self._pump(key)

    def _finished(self, task: asyncio.Task[None]) -> None:
        item = self._running.pop(task)
        ok = not task.cancelled() and task.exception() is None
        if not ok and not task.cancelled() and not isinstance(task.exception(), OwnershipLost):
            log.error("work for key %r crashed", item.key, exc_info=task.exception())
        self._busy.discard(item.key)
        self._release(item, ok)
        self._pump(item.key)

    def _release(
        self, item: Admitted, ok: bool, *, admitted: bool = True, settle: bool = True
    ) -> None:
        if admitted:
            self._in_flight -= 1
        try:
            item.done(ok)
        except Exception:  # the host's bookkeeping failed; the key must still go on
            log.exception("done callback for key %r failed", item.key)
        epochs = self.epochs
        if epochs.quiet:  # EpochManager.leave, inline: nothing can be due
            item.epoch.unfinished -= 1
        else:
            epochs.leave(item.epoch)  # may trigger a watermark, which may submit timers
        if settle:
            self._settle()

    def _settle(self) -> None:
        """Admission, capacity and idleness after records were released."""
        self._admit_waiting()
        if self._strict:
            self._unblock()
        if self.has_capacity:
            self._capacity.set()
            if self._room:
                self._wake_room()
        if self._in_flight == 0 and not self._waiting:
            self._idle.set()

    def _wake_room(self) -> None:
        free, kept = self.free_slots, []
        for slots, waiter in self._room:
            if waiter.done():
                continue
            if free >= slots or not self._in_flight:
                waiter.set_result(None)
            else:
                kept.append((slots, waiter))
        self._room = kept

    async def join(self) -> None:
        """Wait until nothing is admitted, waiting or running (timers included)."""
        while self._in_flight or self._waiting:
            await self._idle.wait()  # re-checked: a watermark may have submitted more

    async def drain(
        self, groups: AbstractSet[Hashable] | None = None, timeout: float = 10.0
    ) -> int:
        """Stop the work of ``groups`` (all when None) and return once none of it runs.

        Steps: (1) refuse records of ``groups`` submitted from now on (a record that
        finishes may trigger a watermark that fires their timers); (2) abandon their
        waiting and buffered records; (3) wait up to ``timeout`` for their running work;
        (4) cancel what is left and wait until it has stopped. Returns how many records
        were abandoned; abandoned records were not committed and replay from the journal
        later (abandoned timers stay in the journal for the next owner).
        """
        drain = _Drain(None if groups is None else set(groups))
        self._drains.append(drain)
        try:
            # Queued records first: releasing a ready one pumps its key and admits
            # waiting records (``_pump`` abandons those of this drain's groups).
            self._drop_queued(drain)
            self._drop_ready(drain)
            running: list[asyncio.Future[Any]] = [
                t for t, i in self._running.items() if drain.selects(i)
            ]
            if any(drain.selects(item) for item in self._open):
                drain.quiet = asyncio.get_running_loop().create_future()
                running.append(drain.quiet)
            if running:
                await asyncio.wait(running, timeout=timeout)
                pending = {t for t in running if not t.done() and t is not drain.quiet}
                drain.abandoned += len(pending)
                # Lane records still open: their lanes are stopped, what they did not
                # report is abandoned.
                late = [item for item in self._open if drain.selects(item)]
                drain.abandoned += len(late)
                lanes = {id(item.lane): item.lane for item in late}
                for lane in lanes.values():
                    await lane.stop()  # type: ignore[union-attr]
                    self.finished([i for i in self._open if i.lane is lane], False)
                if drain.quiet is not None and not drain.quiet.done():
                    drain.quiet.cancel()
                await cancel_all(pending)
        finally:
            self._drains.remove(drain)
        return drain.abandoned

    def _drop_ready(self, drain: _Drain) -> None:
        """Started records of the drained groups not handed to their lane yet: they have
        not run, so they are abandoned like queued ones."""
        for lane, items in list(self._ready.items()):
            selected = [i for i in items if drain.selects(i)]
            if not selected:
                continue
            kept = [i for i in items if not drain.selects(i)]
            if kept:
                self._ready[lane] = kept
            else:
                del self._ready[lane]
            for item in selected:
                drain.abandoned += 1
                self._busy.discard(item.key)
                self._release(item, False)
                self._pump(item.key)

    def _drop_queued(self, drain: _Drain) -> None:
        dropped = [w.item for w in self._waiting if drain.selects(w.item)]
        if dropped:
            self._waiting = [w for w in self._waiting if not drain.selects(w.item)]
            heapq.heapify(self._waiting)
        for item in dropped:
            drain.abandoned += 1
            self._release(item, False, admitted=False)
        for key in list(self._buffers):
            buffer = self._buffers.get(key)
            selected = [i for i in buffer or () if drain.selects(i)]
            if not selected:
                continue
            self._buffers[key] = deque(i for i in buffer or () if not drain.selects(i))
            for item in selected:
                drain.abandoned += 1
                self._release(item, False)
            self._pump(key)
