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
* Batches: a record whose work is :class:`Batched` is started like any other (its key
  free, its epoch allowed, admitted), but instead of a task of its own it joins the
  records of its lane started in the same loop iteration; one task runs them together
  and reports each one's end separately, which releases its key at once. Cancelling
  that task (a drain) abandons the records it has not reported.
* Early key release: a batch may also report that a record's key is free before the
  record is finished (``finish.release(i)``): the next record of the key starts, while
  this one stays in flight (not committable, its epoch open) until ``finish(i, ok)``.
  The worker's agents use it once a record's ActionDone is acked and its outputs are
  sent: what the next record does can no longer reorder or change them.
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
from typing import Any, Protocol, final

from ..durable.ownership import OwnershipLost
from .epochs import Epoch, EpochManager, EpochMode

log = logging.getLogger("agents_stream.runtime")

Work = Callable[[], Coroutine[Any, Any, None]]


class BatchFinish(Protocol):
    """How a batch's ``run`` reports: ``finish(i, ok)`` when record ``i`` is finished
    (``many`` for several at once), ``release(i)`` / ``release_many`` when its key is
    free before that (see the module doc)."""

    def __call__(self, index: int, ok: bool) -> None: ...

    def many(self, indices: list[int], ok: bool) -> None: ...

    def release(self, index: int) -> None: ...

    def release_many(self, indices: list[int]) -> None: ...


# Runs the payloads of one lane's batch, reporting each record's end to the finish hook.
BatchRun = Callable[[list[Any], BatchFinish], Coroutine[Any, Any, None]]


@final
class Batched:
    """Work the controller may run together with other records of ``lane``: the lane's
    records started in one loop iteration go to one call of ``run``."""

    __slots__ = ("lane", "payload", "run")

    def __init__(self, lane: Hashable, payload: Any, run: BatchRun) -> None:
        self.lane = lane
        self.payload = payload
        self.run = run


@dataclass
class _Pending:
    key: Hashable
    group: Hashable  # what drain() selects by, e.g. (topic, partition)
    work: Work | Batched
    done: Callable[[bool], None]  # called with True when finished, False when abandoned
    epoch: Epoch


class _Batch:
    """The records one batch task runs; each is reported once (and its key released at
    most once before that)."""

    __slots__ = ("items", "open", "released")

    def __init__(self, items: list[_Pending]) -> None:
        self.items = items
        self.open = set(range(len(items)))
        self.released: set[int] = set()  # open, but their key is free already


class _Finish:
    """What a batch's ``run`` reports with: ``finish(i, ok)`` when record ``i`` is
    finished; ``finish.release(i)`` when its key is free before that."""

    __slots__ = ("_batch", "_controller")

    def __init__(self, controller: ExecutionController, batch: _Batch) -> None:
        self._controller = controller
        self._batch = batch

    def __call__(self, index: int, ok: bool) -> None:
        self._controller._batch_item_done(self._batch, index, ok)

    def release(self, index: int) -> None:
        self._controller._batch_item_released(self._batch, index)

    def many(self, indices: list[int], ok: bool) -> None:
        """``finish(i, ok)`` for each of ``indices``, the shared bookkeeping once."""
        self._controller._batch_items_done(self._batch, indices, ok)

    def release_many(self, indices: list[int]) -> None:
        """``release(i)`` for each of ``indices``."""
        controller, batch = self._controller, self._batch
        for index in indices:
            controller._batch_item_released(batch, index)


@dataclass
class _Drain:
    groups: set[Hashable] | None  # None: every group
    abandoned: int = 0

    def selects(self, item: _Pending) -> bool:
        return self.groups is None or item.group in self.groups


@dataclass(order=True)
class _Waiting:
    epoch_id: int
    arrival: int
    item: _Pending = field(compare=False)


class ExecutionController:
    def __init__(
        self, max_in_flight: int = 6000, *, epoch_mode: EpochMode = "out_of_order"
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self.epochs = EpochManager(epoch_mode)
        self._strict = epoch_mode == "strict"
        self._buffers: dict[Hashable, deque[_Pending]] = {}  # waiting records per key
        self._busy: set[Hashable] = set()  # keys with a running record
        self._blocked: dict[Hashable, None] = {}  # keys whose next record waits for an epoch
        self._running: dict[asyncio.Task[None], _Pending] = {}
        self._batches: dict[asyncio.Task[None], _Batch] = {}
        self._ready: dict[Hashable, list[_Pending]] = {}  # started, batch task not yet made
        self._batching = False  # a _start_batches call is scheduled
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
        self, key: Hashable, group: Hashable, work: Work | Batched, done: Callable[[bool], None]
    ) -> None:
        """Run ``work`` after every earlier record of ``key``; ``done`` reports the end.

        Called from a watermark callback, the record belongs to that watermark's epoch.
        A record of a group being drained is abandoned at once (``done(False)``).
        """
        epochs = self.epochs
        if epochs.quiet:  # no watermark pending: EpochManager.enter, inline
            epoch = epochs.current
            epoch.unfinished += 1
        else:
            epoch = epochs.enter()
        item = _Pending(key, group, work, done, epoch)
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

    def _admit(self, item: _Pending) -> None:
        in_flight = self._in_flight = self._in_flight + 1
        if in_flight > self.peak_in_flight:
            self.peak_in_flight = in_flight
        if in_flight >= self.max_in_flight:
            self._capacity.clear()
        key = item.key
        buffer = self._buffers.get(key)
        if buffer is None and key not in self._busy and not self._strict and not self._drains:
            # Its key is idle (most records): started at once, no buffer made. While a
            # drain runs, _pump decides (a waiting record admitted now may be of its
            # group).
            self._start(item)
            return
        if buffer is None:  # not setdefault: that builds a deque per record
            buffer = self._buffers[item.key] = deque()
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

    def _start(self, head: _Pending) -> None:
        """Run ``head`` now: its key is free and its epoch allowed (see _pump)."""
        self._busy.add(head.key)
        work = head.work
        if type(work) is Batched:
            lane = self._ready.get(work.lane)
            if lane is None:
                self._ready[work.lane] = [head]
            else:
                lane.append(head)
            if not self._batching:
                self._batching = True
                asyncio.get_running_loop().call_soon(self._start_batches)
            return
        task = asyncio.get_running_loop().create_task(work())
        self._running[task] = head
        task.add_done_callback(self._finished)

    def _draining(self, item: _Pending) -> _Drain | None:
        drains = self._drains
        return next((d for d in drains if d.selects(item)), None) if drains else None

    def _start_batches(self) -> None:
        self._batching = False
        ready, self._ready = self._ready, {}
        loop = asyncio.get_running_loop()
        for items in ready.values():
            if not items:
                continue
            if self._drains:  # started before a drain of their group began: abandoned
                kept = []
                for item in items:
                    drain = next((d for d in self._drains if d.selects(item)), None)
                    if drain is None:
                        kept.append(item)
                        continue
                    drain.abandoned += 1
                    self._busy.discard(item.key)
                    self._release(item, False)
                    self._pump(item.key)
                if not (items := kept):
                    continue
            batch = _Batch(items)
            run = items[0].work.run  # type: ignore[union-attr]
            payloads = [item.work.payload for item in items]  # type: ignore[union-attr]
            task = loop.create_task(run(payloads, _Finish(self, batch)))
            self._batches[task] = batch
            task.add_done_callback(self._batch_finished)

    def _batch_item_done(self, batch: _Batch, index: int, ok: bool) -> None:
        if index not in batch.open:
            return
        batch.open.discard(index)
        item = batch.items[index]
        if index in batch.released:  # its key may run the next record already
            batch.released.discard(index)
            self._release(item, ok)
            return
        self._busy.discard(item.key)
        self._release(item, ok)
        self._pump(item.key)

    def _batch_items_done(self, batch: _Batch, indices: list[int], ok: bool) -> None:
        """``_batch_item_done`` of many: each record is released and its key pumped in
        order, what depends only on the totals (admission, capacity, idleness) once."""
        is_open, released, busy = batch.open, batch.released, self._busy
        for index in indices:
            if index not in is_open:
                continue
            is_open.discard(index)
            item = batch.items[index]
            if index in released:  # its key may run the next record already
                released.discard(index)
                self._release(item, ok, settle=False)
                continue
            busy.discard(item.key)
            self._release(item, ok, settle=False)
            self._pump(item.key)
        self._settle()

    def _batch_item_released(self, batch: _Batch, index: int) -> None:
        if index not in batch.open or index in batch.released:
            return
        batch.released.add(index)
        key = batch.items[index].key
        self._busy.discard(key)
        self._pump(key)

    def _batch_finished(self, task: asyncio.Task[None]) -> None:
        batch = self._batches.pop(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("batch of %d records crashed", len(batch.items), exc_info=task.exception())
        elif batch.open and not task.cancelled():
            log.error("batch ended without reporting %d of its records", len(batch.open))
        for index in sorted(batch.open):
            self._batch_item_done(batch, index, False)

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
        self, item: _Pending, ok: bool, *, admitted: bool = True, settle: bool = True
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
            running = [t for t, i in self._running.items() if drain.selects(i)]
            running += [
                t for t, b in self._batches.items() if any(drain.selects(i) for i in b.items)
            ]
            if running:
                _, pending = await asyncio.wait(running, timeout=timeout)
                for task in pending:
                    batch = self._batches.get(task)
                    drain.abandoned += 1 if batch is None else len(batch.open)
                while pending:
                    for task in pending:
                        task.cancel()
                    _, pending = await asyncio.wait(pending, timeout=1.0)
                    if pending:
                        log.warning("%d cancelled records still running", len(pending))
        finally:
            self._drains.remove(drain)
        return drain.abandoned

    def _drop_ready(self, drain: _Drain) -> None:
        """Started records of the drained groups whose batch task is not made yet: they
        have not run, so they are abandoned like queued ones."""
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
