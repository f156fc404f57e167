"""RecordLane: the first action of a partition's records, driven together.

Why: run one by one, every record paid for its own asyncio task, coroutine chain,
greenlet driver and ack wait, and each ActionDone was appended and awaited on its own.
A lane drives the first action of every record its scheduler starts (records of one
partition; the scheduler starts at most one record per key at a time), from loop
callbacks, without a task of its own:

* a sync action runs in a carrier greenlet (``bridge.start``, reused from action to
  action); when it waits (a journal ack, a code block in the pool) it switches back here
  with the awaitable, and the lane resumes it once that is done, in a *round* with every
  other resumption that became ready meanwhile (one loop callback per round). An async
  action runs on a task of its own (so that timeouts and cancellation inside it stay its
  own);
* the actions that returned in one round are completed as a group: one append of their
  ActionDones, one ack wait, their outputs sent from the producer's thread once the
  ActionDones are acked (group commit);
* each record is reported as soon as it is finished (its outputs acked), so that it
  can be committed while others still run; the next record of its key may start
  earlier, once the record's ActionDone is acked and its outputs are sent
  (``released``): from there nothing the next record does can reorder or change them
  (the producer keeps a partition's records in the order sent), and on a crash the
  record is replayed from its ActionDone either way. The two ack waits of a record
  (ActionDone, then outputs) are no longer both on its key's path.

Records are handed over as *tickets* (the scheduler's own objects, carrying the
:class:`RecordInput` as ``payload``) and reported by ticket through one
:class:`LaneReports`; there is no index translation and no second ready list between
the scheduler and this driver. :meth:`RecordLane.stop` (a drain) unwinds what is in
flight; its unreported tickets are the scheduler's to abandon.

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
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from greenlet import GreenletExit

from ..ackfuture import AckFuture
from ..errors import PartialSendError, RecordRefusedError
from .acks import acked
from .bridge import Carrier, Finished, release, run_coroutine_bridged, start
from .journal import ActionDone, ActionRef
from .ownership import OwnershipLost
from .runner import ActionRunner, RecordInput, RecordOutcome, input_event

if TYPE_CHECKING:
    from ..events import InputEvent
    from .context import RunnerContext
    from .journal import MemorySnapshot

log = logging.getLogger("agents_stream.durable")

# Every 16 actions started or resumed, delivery reports that are due are served (where
# the loop serves them: ContextConfig.acks, durable/acks.py); a mask, as the check runs
# per record.
_SERVE_EVERY = 15


class Ticket(Protocol):
    """A record as its scheduler hands it over."""

    @property
    def payload(self) -> RecordInput: ...


T = TypeVar("T", bound=Ticket)
# A record's end on its own: its outcome, the exception its actions raised, or
# CancelledError (its action was cancelled: abandoned like a drained record).
Ended = RecordOutcome | Exception | asyncio.CancelledError


class LaneReports(Protocol[T]):
    """Where a lane reports its records' ends, each ticket once."""

    def report(self, ticket: T, outcome: Ended) -> None:
        """The record ended alone: its outcome, or the exception its actions raised
        (:class:`asyncio.CancelledError` when its action was cancelled: abandoned like a
        drained record, never committed)."""

    def finished(self, done: list[tuple[T, RecordOutcome]]) -> None:
        """The records of one group commit finished together (outputs acked)."""

    def released(self, tickets: list[T]) -> None:
        """These records' keys may run their next record (ActionDone acked, outputs
        sent); each is still reported later. Called only for a lane made with
        ``release_early``."""


class _Run:
    """One record's first action in flight."""

    __slots__ = ("base", "child", "ctx", "event", "record", "ref", "snapshot", "ticket")

    def __init__(
        self,
        ticket: Any,
        record: RecordInput,
        ref: ActionRef,
        ctx: RunnerContext,
        snapshot: Callable[[], MemorySnapshot | None],
        base: Callable[[], dict[str, bytes]],
        child: Carrier | None,
        event: InputEvent,
    ) -> None:
        self.ticket = ticket
        self.record = record
        self.ref = ref
        self.ctx = ctx
        self.snapshot = snapshot
        self.base = base
        self.child = child
        self.event = event


class RecordLane(Generic[T]):
    def __init__(
        self, runner: ActionRunner, reports: LaneReports[T], *, release_early: bool = False
    ) -> None:
        self._runner = runner
        self._reports = reports
        self._release_early = release_early
        self._ready: list[tuple[Callable[[Any], None], Any]] = []
        self._scheduled = False  # a round is scheduled
        self._group: list[tuple[_Run, ActionDone, RecordOutcome]] = []
        self._live: dict[Any, _Run] = {}  # suspended actions, by ticket
        self._waits: set[asyncio.Future[Any]] = set()
        # Resolved on other threads (a pool result, a journal ack): see _from_thread.
        self._incoming: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._wake_pending = False
        self._open = 0  # tickets started, not reported
        self._idle: asyncio.Future[None] | None = None
        self.stopped = False
        self._loop = asyncio.get_running_loop()

    @property
    def open(self) -> int:
        """Records started and not reported yet."""
        return self._open

    def start(self, tickets: Sequence[T]) -> None:
        """Start the first action of each record (distinct keys); they are reported
        later, never from inside this call."""
        if self.stopped:
            raise RuntimeError("a stopped lane starts nothing")
        self._open += len(tickets)
        context = contextvars.copy_context()
        failed: list[tuple[T, Exception]] = []
        serve_due = self._runner.config.acks.serve_due
        for n, ticket in enumerate(tickets):
            if n & _SERVE_EVERY == _SERVE_EVERY:
                serve_due()  # hundreds of actions started: acks meanwhile
            try:
                self._start(ticket, context)
            except Exception as exc:  # e.g. an unreadable journal entry of this record
                failed.append((ticket, exc))
        self._flush()
        if failed:  # reported in a later round: the scheduler is inside its start call
            for ticket, error in failed:
                self._ready.append((partial(self._report, ticket), error))
            self._schedule()

    async def idle(self) -> None:
        """Return once every record started is reported."""
        while self._open:
            self._idle = self._loop.create_future()
            await self._idle

    async def stop(self) -> None:
        """Unwind the suspended actions and stop what they and the records on their own
        wait for; return once none runs. Nothing is reported from here on: unreported
        tickets are the scheduler's to abandon."""
        self.stopped = True
        for run in list(self._live.values()):
            try:
                run.child.throw(GreenletExit())  # type: ignore[union-attr]
            except BaseException:  # an action unwinding: nobody is left to report to
                pass
        self._live.clear()
        self._ready.clear()
        self._incoming.clear()
        await cancel_all(set(self._waits))

    def _start(self, ticket: T, context: contextvars.Context) -> None:
        record = ticket.payload
        runner = self._runner
        spec = runner.batch_spec
        if spec is None:
            self._alone(ticket, record)
            return
        store = runner.store
        ref = ActionRef(record.key, record.seq, f"{spec.name}#0", record.partition, runner.topic)
        # A record without journal entries runs without reading the journal; one with
        # them (recovery) first asks whether its first action is done already.
        fresh = store.fresh(record.key, record.seq, record.partition)
        if not fresh:
            ref = store.resolve(ref)
            if store.done(ref) is not None:  # recovery: the per-record path replays it
                self._alone(ticket, record)
                return
        ctx, snapshot, base = runner.context(ref, None, record.keyless, fresh=fresh)
        event = input_event(record)
        if spec.is_async:
            # Its own task, as on the per-record path: asyncio.timeout(), TaskGroups and
            # cancellation inside the action act on the action alone.
            run = _Run(ticket, record, ref, ctx, snapshot, base, None, event)
            coro = spec.fn(event, ctx)
            task = asyncio.ensure_future(run_coroutine_bridged(coro) if spec.in_carrier else coro)
            self._wait(task, partial(self._async_returned, run))
            return
        if not spec.in_carrier:
            # Its code names no ctx.execute: nothing to suspend for, so no carrier (two
            # greenlet switches per record). One that calls it from a helper blocks the
            # loop this once and runs in a carrier from then on (see learn_calls_sync).
            run = _Run(ticket, record, ref, ctx, snapshot, base, None, event)
            try:
                context.copy().run(spec.fn, event, ctx)  # a copy, as a task would have
            except Exception as exc:
                self._report(ticket, exc)
                return
            self._returned(run)
            return
        # Each action in a carrier greenlet with a copy of the starting context, as a
        # task would have (copied once per start call).
        carrier, step = start(spec.fn, (event, ctx), context.copy())
        self._stepped(_Run(ticket, record, ref, ctx, snapshot, base, carrier, event), step)

    def _async_returned(self, run: _Run, task: asyncio.Future[None]) -> None:
        if task.cancelled():
            self._report(run.ticket, asyncio.CancelledError())
            return
        exc = task.exception()
        if exc is None:
            self._returned(run)
        elif isinstance(exc, Exception):
            self._report(run.ticket, exc)
        else:
            raise exc  # e.g. KeyboardInterrupt: not the record's failure

    # -- driving actions ----------------------------------------------------------------
    def _stepped(self, run: _Run, step: Any) -> None:
        """``run``'s action returned, raised, or waits for the awaitable ``step``."""
        if type(step) is Finished:
            self._live.pop(run.ticket, None)
            release(run.child)  # type: ignore[arg-type]
            _, error = step.take()
            if error is not None:
                if not isinstance(error, Exception):
                    raise error  # e.g. KeyboardInterrupt: not the record's failure
                self._report(run.ticket, error)
            else:
                self._returned(run)
            return
        self._live[run.ticket] = run
        if isinstance(step, Future):  # a code block's result, a journal ack
            self._wait_thread(step, partial(self._resume, run))
        else:
            self._wait(asyncio.ensure_future(step), partial(self._resume, run))

    def _resume(self, run: _Run, fut: asyncio.Future[Any] | Future[Any]) -> None:
        child = run.child
        assert child is not None
        if type(fut) is AckFuture:  # a code block's result, an ack: never cancelled
            value, exc = fut.outcome()
        elif fut.cancelled():
            self._stepped(run, child.throw(asyncio.CancelledError()))
            return
        else:
            exc = fut.exception()
            value = None if exc is not None else fut.result()
        # An error is delivered into the action, which may handle it.
        self._stepped(run, child.throw(exc) if exc is not None else child.switch(value))

    def _returned(self, run: _Run) -> None:
        runner = self._runner
        outcome = RecordOutcome()
        try:
            done = runner.complete(run.ref, run.ctx, run.snapshot, outcome)
        except OwnershipLost as exc:  # the partition is another member's now
            self._report(run.ticket, exc)
            return
        if runner.changes_key_state(done) or done.events or not runner.sink.threadsafe:
            self._wait(
                asyncio.ensure_future(self._settle_alone(run, done, outcome)),
                partial(self._finished_alone, run.ticket),
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
    def _alone(self, ticket: T, record: RecordInput) -> None:
        self._wait(
            asyncio.ensure_future(self._runner.run(record)), partial(self._finished_alone, ticket)
        )

    def _finished_alone(self, ticket: T, task: asyncio.Future[RecordOutcome]) -> None:
        if task.cancelled():
            self._report(ticket, asyncio.CancelledError())
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, Exception):
            raise exc  # e.g. KeyboardInterrupt: not a record's failure
        self._report(ticket, exc if exc is not None else task.result())

    # -- reports ------------------------------------------------------------------------
    def _report(self, ticket: T, outcome: Ended) -> None:
        self._open -= 1
        self._reports.report(ticket, outcome)
        if not self._open:
            self._wake_idle()

    def _report_finished(self, done: list[tuple[T, RecordOutcome]]) -> None:
        self._open -= len(done)
        self._reports.finished(done)
        if not self._open:
            self._wake_idle()

    def _wake_idle(self) -> None:
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(None)

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
            self._report(part[0][0].ticket, exc)
            return
        if serially:
            self._serially(part, partition)
            return
        for item in part:
            try:
                self._commit_group([item], partition)
            except Exception as alone:
                self._report(item[0].ticket, alone)

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
                self._report(item[0].ticket, alone)

    def _commit_group(
        self,
        part: list[tuple[_Run, ActionDone, RecordOutcome]],
        partition: int,
        *,
        after: Callable[[], None] | None = None,
    ) -> None:
        sends = [(done, run.ctx.outputs) for run, done, _ in part if run.ctx.outputs]
        journaled, appended = self._runner.journal_then_send(
            [d for _, d, _ in part], sends, partition
        )
        if sends and self._release_early:
            # A released key's next record has its outputs produced after these (see
            # ActionRunner.journal_then_send).
            self._wait(acked(journaled), partial(self._group_released, part))
        done = partial(self._group_done, part, journaled)
        self._wait(acked(appended), done if after is None else partial(_and_then, done, after))

    def _group_released(
        self, group: list[tuple[_Run, ActionDone, RecordOutcome]], fut: asyncio.Future[None]
    ) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the group's report carries the failure (and frees the keys)
        self._reports.released([run.ticket for run, _, _ in group])

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
                    self._report(run.ticket, exc)  # type: ignore[arg-type]
                return
            # Only some records' outputs failed (their positions count the records with
            # outputs, as send_outputs sent them): the others are finished.
            failed: dict[int, Exception] = {}
            sending = (id(run) for run, _, _ in group if run.ctx.outputs)
            for position, key in enumerate(sending):
                if position in exc.failed:
                    failed[key] = exc.failed[position]
            for run, _, _ in group:
                if id(run) in failed:
                    self._report(run.ticket, failed[id(run)])
            group = [item for item in group if id(item[0]) not in failed]
        pairs = []
        for run, _, outcome in group:
            outcome.outputs.extend(run.ctx.outputs)
            pairs.append((run.ticket, outcome))
        if pairs:
            self._report_finished(pairs)  # one call for the group: the host's bookkeeping

    # -- rounds -------------------------------------------------------------------------
    def _wait(self, fut: asyncio.Future[Any], handler: Callable[[Any], None]) -> None:
        self._waits.add(fut)
        fut.add_done_callback(partial(self._arrived, handler))

    def _arrived(self, handler: Callable[[Any], None], fut: asyncio.Future[Any]) -> None:
        self._waits.discard(fut)
        if self.stopped:
            return
        self._ready.append((handler, fut))
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        self._loop.call_soon(self._round)

    def _wait_thread(self, fut: Future[Any], handler: Callable[[Any], None]) -> None:
        """Wait for a future resolved on another thread without an asyncio future per
        wait (``acks.acked`` builds one, and its callback costs a loop round of its own):
        the resolving thread queues the handler here and wakes the loop once per burst."""
        if fut.done():
            self._ready.append((handler, fut))
            if not self._scheduled:
                self._schedule()
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
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # loop closed: the lane is gone
            pass

    def _wake(self) -> None:
        self._wake_pending = False
        self._run_round()

    def _round(self) -> None:
        self._scheduled = False
        self._run_round()

    def _run_round(self) -> None:
        """Resume every action whose wait ended, then commit the actions that returned
        as one group."""
        if self.stopped:
            return
        ready, self._ready = self._ready, []
        incoming = self._incoming
        while incoming:
            ready.append(incoming.popleft())
        serve_due = self._runner.config.acks.serve_due
        for n, (handler, arg) in enumerate(ready):
            if n & _SERVE_EVERY == _SERVE_EVERY:
                serve_due()
            try:
                handler(arg)
            except Exception:  # a bug here must not strand the records after it
                log.exception("a record lane step failed")
        self._flush()


class _ByIndex:
    """A ticket that is a position in a list of records (:func:`run_records`)."""

    __slots__ = ("index", "payload")

    def __init__(self, index: int, payload: RecordInput) -> None:
        self.index = index
        self.payload = payload


# How run_records reports: by position.
Report = Callable[[int, Ended], None]
ReportFinished = Callable[[list[tuple[int, RecordOutcome]]], None]


class _IndexReports:
    __slots__ = ("_finished", "_released", "_report")

    def __init__(
        self,
        report: Report,
        released: Callable[[list[int]], None] | None,
        finished: ReportFinished | None,
    ) -> None:
        self._report = report
        self._released = released
        self._finished = finished

    def report(self, ticket: _ByIndex, outcome: Ended) -> None:
        self._report(ticket.index, outcome)

    def finished(self, done: list[tuple[_ByIndex, RecordOutcome]]) -> None:
        if self._finished is not None:
            self._finished([(ticket.index, outcome) for ticket, outcome in done])
        else:
            for ticket, outcome in done:
                self._report(ticket.index, outcome)

    def released(self, tickets: list[_ByIndex]) -> None:
        if self._released is not None:
            self._released([ticket.index for ticket in tickets])


async def run_records(
    runner: ActionRunner,
    records: Sequence[RecordInput],
    report: Report,
    released: Callable[[list[int]], None] | None = None,
    finished: ReportFinished | None = None,
) -> None:
    """Run ``records`` (of one partition, distinct keys) concurrently on a lane of their
    own and return once each is reported: ``report(index, outcome or exception)`` as soon
    as it is finished (actions done, journal and outputs acked). Same effects as
    :meth:`ActionRunner.run` per record; the journal appends and ack waits of records
    that finish together are shared. ``released(indices)``, if given, is called before
    their reports once the next record of each record's key may start (its ActionDone
    acked, its outputs sent); ``finished(pairs)``, if given, reports the records of one
    group that finished in one call instead of ``report`` per record (failures always go
    to ``report``). Cancelled, the lane is stopped."""
    lane: RecordLane[_ByIndex] = RecordLane(
        runner, _IndexReports(report, released, finished), release_early=released is not None
    )
    lane.start([_ByIndex(index, record) for index, record in enumerate(records)])
    try:
        await lane.idle()
    except BaseException:
        await lane.stop()
        raise


async def cancel_all(pending: set[asyncio.Future[Any]]) -> None:
    """Cancel ``pending`` and return once every one has stopped (a cancelled record may
    take a while to unwind: said once a second)."""
    while pending:
        for fut in pending:
            fut.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
        if pending:
            log.warning("%d cancelled records still running", len(pending))


def _and_then(handler: Callable[[Any], None], after: Callable[[], None], fut: Any) -> None:
    try:
        handler(fut)
    finally:
        after()
