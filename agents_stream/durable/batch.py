"""RecordBatch: the first action of many records, run together on one task.

Why: run one by one, every record paid for its own asyncio task, coroutine chain,
greenlet driver and ack wait, and each ActionDone was appended and awaited on its own.
Here one task drives the first action of every record of a batch (records of one
partition with distinct keys, as the execution controller starts them):

* a sync action runs in a carrier greenlet (``bridge.start``, reused from action to
  action); when it waits (a journal ack, a code block in the pool) it switches back here
  with the awaitable, and this driver resumes it once that is done, with every other
  resumption that became ready at the same time. An async action runs on a task of its
  own (so that timeouts and cancellation inside it stay its own);
* the actions that returned in one round are completed as a group: one append of their
  ActionDones, one ack wait, their outputs sent from the producer's thread once the
  ActionDones are acked, their emitted markers once the outputs are (group commit);
* each record is reported as soon as it is finished (its outputs acked), so that it
  can be committed while others of the batch still run; the next record of its key may
  start earlier, once the record's ActionDone is acked and its outputs are sent
  (``released``): from there nothing the next record does can reorder or change them
  (the producer keeps a partition's records in the order sent), and on a crash the
  record is replayed from its ActionDone either way. The two ack waits of a record
  (ActionDone, then outputs) are no longer both on its key's path.

The guarantees are the per-record path's (``runner.py``): a journaled call's record is
acked before the action goes on, the ActionDone is acked before the outputs are sent,
and a record is reported finished only once its outputs are acked. Records this path
does not take run through :meth:`ActionRunner.run` on their own task: a journal that
already holds the action's ActionDone (recovery), and, after the first action, records
that changed key state (memory, timers) or sent events to further actions.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

from greenlet import GreenletExit

from ..errors import PartialSendError, RecordRefusedError
from .ackfuture import serve_due, then
from .acks import acked
from .bridge import Finished, _Bridged, release, run_coroutine_bridged, start
from .journal import ActionDone, ActionRef
from .ownership import OwnershipLost
from .runner import ActionRunner, RecordInput, RecordOutcome, input_event

if TYPE_CHECKING:
    from ..events import InputEvent
    from .context import RunnerContext
    from .journal import MemorySnapshot

# A record's end: its outcome, the exception its actions raised, or CancelledError (its
# action was cancelled: abandoned like a drained record, never committed).
Report = Callable[[int, RecordOutcome | Exception | asyncio.CancelledError], None]
# Every 16 actions started or resumed, delivery reports that are due are served (where
# the loop serves them, see ackfuture.serve_due); a mask, as the check runs per record.
_SERVE_EVERY = 15
# Records of one group commit finished together: (index, outcome) pairs in one call.
ReportFinished = Callable[[list[tuple[int, RecordOutcome]]], None]


class _Run:
    """One record's first action in flight."""

    __slots__ = ("base", "child", "ctx", "event", "index", "record", "ref", "snapshot")

    def __init__(
        self,
        index: int,
        record: RecordInput,
        ref: ActionRef,
        ctx: RunnerContext,
        snapshot: Callable[[], MemorySnapshot | None],
        base: Callable[[], dict[str, bytes]],
        child: _Bridged | None,
        event: InputEvent,
    ) -> None:
        self.index = index
        self.record = record
        self.ref = ref
        self.ctx = ctx
        self.snapshot = snapshot
        self.base = base
        self.child = child
        self.event = event


class RecordBatch:
    def __init__(
        self,
        runner: ActionRunner,
        records: Sequence[RecordInput],
        report: Report,
        released: Callable[[list[int]], None] | None = None,
        finished: ReportFinished | None = None,
    ) -> None:
        self._runner = runner
        self._records = records
        self._report = report
        self._released = released
        self._finished = finished
        self._ready: list[tuple[Callable[..., None], Any]] = []
        self._signal: asyncio.Future[None] | None = None
        self._outstanding = 0  # awaitables and tasks whose completion is still to come
        self._group: list[tuple[_Run, ActionDone, RecordOutcome]] = []
        self._live: dict[int, _Run] = {}  # suspended actions, by record index
        self._waits: set[asyncio.Future[Any]] = set()
        # Resolved on other threads (a pool result, a journal ack): see _from_thread.
        self._incoming: deque[tuple[Callable[..., None], Any]] = deque()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        for index, record in enumerate(self._records):
            if index & _SERVE_EVERY == _SERVE_EVERY:
                serve_due()  # a batch starts hundreds of actions: acks meanwhile
            try:
                self._start(index, record, context)
            except Exception as exc:  # e.g. an unreadable journal entry of this record
                self._report(index, exc)
        try:
            self._flush()
            incoming = self._incoming
            while self._outstanding:
                while incoming:
                    self._ready.append(incoming.popleft())
                if not self._ready:
                    self._signal = loop.create_future()
                    await self._signal
                    continue
                ready, self._ready = self._ready, []
                for n, (handler, arg) in enumerate(ready):
                    if n & _SERVE_EVERY == _SERVE_EVERY:
                        serve_due()
                    self._outstanding -= 1
                    handler(arg)
                self._flush()
        except BaseException:
            self._abort()
            raise

    def _start(self, index: int, record: RecordInput, context: contextvars.Context) -> None:
        runner = self._runner
        spec = runner.batch_spec
        if spec is None:
            self._alone(index, record)
            return
        store = runner.store
        ref = ActionRef(record.key, record.seq, f"{spec.name}#0", record.partition, runner.topic)
        # A record without journal entries runs without reading the journal; one with
        # them (recovery) first asks whether its first action is done already.
        fresh = store.fresh(record.key, record.seq, record.partition)
        if not fresh:
            ref = store.resolve(ref)
            if store.done(ref) is not None:  # recovery: the per-record path replays it
                self._alone(index, record)
                return
        ctx, snapshot, base = runner.context(ref, None, record.keyless, fresh=fresh)
        event = input_event(record)
        if spec.is_async:
            # Its own task, as on the per-record path: asyncio.timeout(), TaskGroups and
            # cancellation inside the action act on the action alone.
            run = _Run(index, record, ref, ctx, snapshot, base, None, event)
            coro = spec.fn(event, ctx)
            task = asyncio.ensure_future(run_coroutine_bridged(coro) if spec.in_carrier else coro)
            self._wait(task, partial(self._async_returned, run))
            return
        # Each action in a carrier greenlet with a copy of the caller's context, as a
        # task would have (the caller's is copied once per batch).
        carrier, step = start(spec.fn, (event, ctx), context.copy())
        self._stepped(_Run(index, record, ref, ctx, snapshot, base, carrier, event), step)

    def _async_returned(self, run: _Run, task: asyncio.Future[None]) -> None:
        if task.cancelled():
            self._report(run.index, asyncio.CancelledError())
            return
        exc = task.exception()
        if exc is None:
            self._returned(run)
        elif isinstance(exc, Exception):
            self._report(run.index, exc)
        else:
            raise exc  # e.g. KeyboardInterrupt: not the record's failure

    # -- driving actions ----------------------------------------------------------------
    def _stepped(self, run: _Run, step: Any) -> None:
        """``run``'s action returned, raised, or waits for the awaitable ``step``."""
        if type(step) is Finished:
            self._live.pop(run.index, None)
            release(run.child)  # type: ignore[arg-type]
            _, error = step.take()
            if error is not None:
                if not isinstance(error, Exception):
                    raise error  # e.g. KeyboardInterrupt: not the record's failure
                self._report(run.index, error)
            else:
                self._returned(run)
            return
        self._live[run.index] = run
        if isinstance(step, Future):  # a code block's result, a journal ack
            self._wait_thread(step, partial(self._resume, run))
        else:
            self._wait(asyncio.ensure_future(step), partial(self._resume, run))

    def _resume(self, run: _Run, fut: asyncio.Future[Any] | Future[Any]) -> None:
        child = run.child
        assert child is not None
        if fut.cancelled():
            self._stepped(run, child.throw(asyncio.CancelledError()))
            return
        exc = fut.exception()
        # An error is delivered into the action, which may handle it.
        self._stepped(run, child.throw(exc) if exc is not None else child.switch(fut.result()))

    def _returned(self, run: _Run) -> None:
        runner = self._runner
        outcome = RecordOutcome()
        try:
            done = runner.complete(run.ref, run.ctx, run.snapshot, outcome)
        except OwnershipLost as exc:  # the partition is another member's now
            self._report(run.index, exc)
            return
        if runner.changes_key_state(done) or done.events or not runner.sink.threadsafe:
            self._wait(
                asyncio.ensure_future(self._settle_alone(run, done, outcome)),
                partial(self._finished_alone, run.index),
            )
            return
        self._group.append((run, done, outcome))

    async def _settle_alone(
        self, run: _Run, done: ActionDone, outcome: RecordOutcome
    ) -> RecordOutcome:
        """Key-state effects or further actions: the per-record path from here on."""
        runner = self._runner
        await runner.settle(done, run.ctx, run.base, outcome)
        return await runner.continue_record(run.record, runner.events_of(done), outcome)

    # -- records on their own -----------------------------------------------------------
    def _alone(self, index: int, record: RecordInput) -> None:
        self._wait(
            asyncio.ensure_future(self._runner.run(record)), partial(self._finished_alone, index)
        )

    def _finished_alone(self, index: int, task: asyncio.Future[RecordOutcome]) -> None:
        if task.cancelled():
            self._report(index, asyncio.CancelledError())
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, Exception):
            raise exc  # e.g. KeyboardInterrupt: not a record's failure
        self._report(index, exc if exc is not None else task.result())

    # -- group commit -------------------------------------------------------------------
    def _flush(self) -> None:
        """Append the ActionDones of the actions that returned since the last flush, in
        one go; send their outputs once they are acked; report them once those are."""
        group, self._group = self._group, []
        if not group:
            return
        by_partition: dict[int, list[tuple[_Run, ActionDone, RecordOutcome]]] = {}
        for item in group:
            by_partition.setdefault(item[0].ref.partition, []).append(item)
        for partition, part in by_partition.items():
            try:
                self._commit_group(part, partition)
            except Exception as exc:
                # Refused before anything was sent (e.g. one ActionDone over the
                # producer's message.max.bytes, an entry the codec cannot encode): one
                # record must not take the others of its group to the dead letters.
                self._one_by_one(part, partition, exc)

    def _one_by_one(
        self,
        part: list[tuple[_Run, ActionDone, RecordOutcome]],
        partition: int,
        exc: Exception,
        *,
        serially: bool = False,
    ) -> None:
        if len(part) == 1:
            self._report(part[0][0].index, exc)
            return
        if serially:
            self._serially(part, partition)
            return
        for item in part:
            try:
                self._commit_group([item], partition)
            except Exception as alone:
                self._report(item[0].index, alone)

    def _serially(
        self, items: list[tuple[_Run, ActionDone, RecordOutcome]], partition: int
    ) -> None:
        """Each item appended alone, the next once the previous is settled. After a
        broker refusal: Kafka's max.message.bytes bounds a whole record batch, and
        records produced back to back share one, so appended "one by one" but at once
        they were refused together again and every record of the group failed (seen on
        Apache Kafka: tests/integration/test_refused_action_done.py; the embedded broker
        enforces no limit)."""
        while items:
            item, items = items[0], items[1:]
            try:
                after = partial(self._serially, items, partition) if items else None
                self._commit_group([item], partition, after=after)
                return
            except Exception as alone:
                self._report(item[0].index, alone)

    def _commit_group(
        self,
        part: list[tuple[_Run, ActionDone, RecordOutcome]],
        partition: int,
        *,
        after: Callable[[], None] | None = None,
    ) -> None:
        runner = self._runner
        appended: Future[None] = runner.store.append([d for _, d, _ in part], partition)
        journaled = appended
        sends = [(done, run.ctx.outputs) for run, done, _ in part if run.ctx.outputs]
        if sends:
            # The outputs are produced by the thread that resolves the ack, in its
            # callback, before it dispatches any later delivery report: a released key's
            # next record has its outputs produced in a later report's callback, so
            # after these, whenever the loop hears of this ack.
            appended = then(appended, partial(runner.send_outputs, sends, partition))
            if self._released is not None:
                self._wait(acked(journaled), partial(self._group_released, part))
        done = partial(self._group_done, part, journaled)
        self._wait(acked(appended), done if after is None else partial(_and_then, done, after))

    def _group_released(
        self, group: list[tuple[_Run, ActionDone, RecordOutcome]], fut: asyncio.Future[None]
    ) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the group's report carries the failure (and frees the keys)
        released = self._released
        assert released is not None
        released([run.index for run, _, _ in group])

    def _group_done(
        self,
        group: list[tuple[_Run, ActionDone, RecordOutcome]],
        journaled: Future[None],
        fut: asyncio.Future[None],
    ) -> None:
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            if (
                isinstance(exc, RecordRefusedError)
                and len(group) > 1
                and journaled.done()
                and journaled.exception() is exc
            ):
                # The broker refused one of the ActionDones (over the topic's
                # max.message.bytes): no output of the group was sent; appended again
                # one by one, only that record fails (those already in the log are
                # written twice under their key, which compaction folds).
                self._one_by_one(group, group[0][0].ref.partition, exc, serially=True)
                return
            if not (
                isinstance(exc, PartialSendError)
                and journaled.done()
                and journaled.exception() is None
            ):
                for run, _, _ in group:
                    self._report(run.index, exc)  # type: ignore[arg-type]
                return
            # Only some records' outputs failed (their positions count the records with
            # outputs, as send_outputs sent them): the others are finished.
            failed: dict[int, Exception] = {}
            sending = (run.index for run, _, _ in group if run.ctx.outputs)
            for position, index in enumerate(sending):
                if position in exc.failed:
                    failed[index] = exc.failed[position]
            for index, error in failed.items():
                self._report(index, error)
            group = [item for item in group if item[0].index not in failed]
        pairs = []
        for run, _, outcome in group:
            outcome.outputs.extend(run.ctx.outputs)
            pairs.append((run.index, outcome))
        if self._finished is not None:
            self._finished(pairs)  # one call for the group: the host's bookkeeping batched
        else:
            for index, outcome in pairs:
                self._report(index, outcome)

    # -- plumbing -----------------------------------------------------------------------
    def _wait(self, fut: asyncio.Future[Any], handler: Callable[[Any], None]) -> None:
        self._outstanding += 1
        self._waits.add(fut)
        fut.add_done_callback(partial(self._arrived, handler))

    def _arrived(self, handler: Callable[[Any], None], fut: asyncio.Future[Any]) -> None:
        self._waits.discard(fut)
        self._ready.append((handler, fut))
        signal = self._signal
        if signal is not None and not signal.done():
            signal.set_result(None)

    def _wait_thread(self, fut: Future[Any], handler: Callable[[Any], None]) -> None:
        """Wait for a future resolved on another thread without an asyncio future per
        wait (``acks.acked`` builds one, and its callback costs a loop round of its own):
        the resolving thread queues the handler here and wakes this batch once per burst."""
        self._outstanding += 1
        if fut.done():
            self._ready.append((handler, fut))
        else:
            fut.add_done_callback(partial(self._from_thread, handler))

    def _from_thread(self, handler: Callable[[Any], None], fut: Future[Any]) -> None:
        # No lock shared with the loop (a resolver preempted holding it would stall the
        # loop): the deque's append/popleft are atomic, and _wake clears the flag before
        # the loop drains, so an arrival is either drained or schedules another wake.
        self._incoming.append((handler, fut))
        if self._wake_pending:
            return
        self._wake_pending = True
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # loop closed: the batch is gone
            pass

    def _wake(self) -> None:
        self._wake_pending = False
        signal = self._signal
        if signal is not None and not signal.done():
            signal.set_result(None)

    def _abort(self) -> None:
        """The batch was cancelled (a drain): unwind the suspended actions and stop what
        they and the records on their own wait for. Nothing is reported; unreported
        records are the controller's to abandon."""
        for run in list(self._live.values()):
            try:
                run.child.throw(GreenletExit())  # type: ignore[union-attr]
            except BaseException:  # an action unwinding: nobody is left to report to
                pass
        self._live.clear()
        for fut in list(self._waits):
            fut.cancel()


def _and_then(handler: Callable[[Any], None], after: Callable[[], None], fut: Any) -> None:
    try:
        handler(fut)
    finally:
        after()
