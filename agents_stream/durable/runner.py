"""ActionRunner: runs one input record through an agent's actions, durably.

Engine-agnostic: the worker, a Spark executor (backfill) or a Faust agent hosts it by
giving it a store and an :class:`OutputSink`. For each input record:

1. Actions triggered by the InputEvent (then by the events those actions send, breadth
   first, in send order) run one after another, each identified by
   ``Agent.method#ordinal`` so re-runs of the same record meet the same ActionStates.
2. An action with an ActionDone record is *not* re-run: its memory updates are applied
   if the key's memory snapshot predates it, its outputs are emitted if they were not
   acknowledged yet, and its journaled events re-trigger downstream actions.
3. Otherwise the action runs with a RunnerContext (journaled calls replay). When it
   returns, ActionDone (memory updates, outputs, events) and the key's new memory
   snapshot are appended and acked, outputs are sent, and once they are acked the
   ActionDone is rewritten with ``emitted=True``.

The record is finished when every action is done and every output acked; only then may
the host commit the input offset.

Timer firings (:meth:`ActionRunner.run_timer`) run the same way, starting from a
``TimerEvent``, as a pseudo-record with ``seq = -(ts + 1)`` and action ids
``Agent.method#e0`` / ``#p0``; once every action of the firing is done the timer is
tombstoned, then the firing's own entries. A firing interrupted by a crash runs again
(its timer is still live) with its journaled calls replayed.

Key-state effects of an action (memory updates, timer registrations/deletions) are
appended after its ActionDone and before the key's new MemorySnapshot, whose ``version``
the ActionDone records: the snapshot being at that version proves every effect is
durable, so recovery re-applies memory and timers of a completed action exactly when the
snapshot predates it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ..ackfuture import then
from ..agent import ActionSpec, Agent
from ..errors import PartialSendError
from ..events import Event, EventError, InputEvent, TimerEvent
from ..tracing import traced_actions
from .acks import acked
from .bridge import run_bridged, run_coroutine_bridged
from .context import ContextConfig, RunnerContext
from .errors import KeylessRecordError
from .faultpoints import POINTS as FAULT_POINTS
from .faultpoints import reached as fault_reached
from .groups import grouped_dones
from .journal import (
    ActionDone,
    ActionRef,
    JournalEntry,
    MemorySnapshot,
    MemoryUpdate,
    SentEvent,
    TimerEntry,
    Tombstone,
    entry_key,
)
from .memory import KeylessMemory, apply_updates
from .payload import JsonCodec
from .sink import NullSink, OutputSink, SinkItem
from .store import ActionStateStore, all_of
from .timers import Timers

log = logging.getLogger(__name__)

# Exactly-once: a failed lookup of a completed action's outputs is tried again after
# these (doubling) instead of sending the outputs again.
LOOKUP_RETRY_FIRST = 0.2
LOOKUP_RETRY_MAX = 5.0


@dataclass
class RecordInput:
    key: str
    seq: int
    value: Any
    partition: int = 0
    timestamp: int | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    # No record key (``key`` is ""): independent of other keyless records, no memory.
    keyless: bool = False
    # What the host made this from (the worker's consumer record), handed back with its
    # report; the durable path never reads it.
    source: Any = field(default=None, repr=False, compare=False)


@dataclass
class RecordOutcome:
    actions_run: int = 0
    actions_skipped: int = 0
    calls_executed: int = 0
    calls_replayed: int = 0
    outputs: list[Any] = field(default_factory=list)
    timer_fired: bool = False  # run_timer only: False when the timer was not live
    # Recovered actions not marked emitted: outputs found in the output topic (not sent
    # again) and outputs sent (not found, or not looked up).
    outputs_found: int = 0
    outputs_resent: int = 0


TimersHook = Callable[[list[TimerEntry]], None]


def _raiser(error: Callable[[], Exception]) -> Callable[[str], None]:
    def guard(what: str) -> None:
        raise error()

    return guard


class ActionRunner:
    """Runs records (and timer firings) of one agent against a store.

    Args:
        on_timers: called with the timers an action registered, once they are durable
            (also when recovery re-writes them); hosts schedule their firing from it.
        topic: the input topic this runner's records come from, part of every action
            run's identity (two topics' records at one partition/offset never share
            ActionStates). Timer firings stay topic-less: a timer belongs to its key and
            agent, not to an input.
        emitted_markers: once an action's outputs are acked, rewrite its ActionDone
            with ``emitted=True`` (see :meth:`send_outputs`). A host whose sink finds
            outputs in the topic may turn them off: a record's ActionDone lives only
            until the commit that passes it prunes it, and in that window the lookup
            answers what the marker would (the exactly-once mode writes none either).
    """

    def __init__(
        self,
        agent: type[Agent],
        store: ActionStateStore,
        config: ContextConfig,
        sink: OutputSink | None = None,
        *,
        on_timers: TimersHook | None = None,
        topic: str = "",
        emitted_markers: bool = True,
        transactional: bool = False,
    ) -> None:
        self.agent = agent
        self.topic = topic
        self.name = agent.__name__  # owner of the timers this agent registers
        self.store = store
        self.config = config
        self.sink = sink or NullSink()
        # Whether the sink may take the journaled bytes of the outputs (see OutputSink).
        self.sends_stored = type(config.codec) is JsonCodec and self.sink.takes_stored
        self.on_timers = on_timers
        self.emitted_markers = emitted_markers
        # Outputs and offsets commit in transactions (exactly-once): an output sent again
        # because its lookup failed would be read twice once both transactions commit.
        self.transactional = transactional
        # Each action in its span when OpenTelemetry is configured (tracing.py).
        self._actions, self.traces = traced_actions(agent.actions())
        # The lane (durable/lane.py) runs the first action of many records
        # together when the input has exactly one listener.
        first = [a for a in self._actions if issubclass(InputEvent, a.listens)]
        self.batch_spec: ActionSpec | None = first[0] if len(first) == 1 else None

    def _listeners(self, event: Event) -> list[ActionSpec]:
        return [a for a in self._actions if isinstance(event, a.listens)]

    async def run(self, record: RecordInput) -> RecordOutcome:
        """Run every action of ``record`` (breadth first) to completion."""
        outcome = RecordOutcome()
        await self._process(
            record.key,
            record.seq,
            record.partition,
            input_event(record),
            "",
            None,
            outcome,
            self.topic,
            keyless=record.keyless,
        )
        return outcome

    async def continue_record(
        self, record: RecordInput, events: list[Event], outcome: RecordOutcome
    ) -> RecordOutcome:
        """Run the actions of the events sent by ``record``'s first action (ordinal 0,
        already done) to completion."""
        if events:
            await self._process(
                record.key,
                record.seq,
                record.partition,
                events,
                "",
                None,
                outcome,
                self.topic,
                keyless=record.keyless,
                ordinal=1,
            )
        return outcome

    async def run_timer(self, key: str, partition: int, kind: str, ts: int) -> RecordOutcome:
        """Fire timer ``(key, kind, ts)`` of this agent, if it is still registered.

        Steps: (1) skip when the store holds no live timer (deleted, or already fired);
        (2) run the actions listening for ``TimerEvent`` like a record with
        ``seq = -(ts + 1)``; (3) tombstone the timer, then the firing's entries, and wait
        for the acks. A crash before (3) fires it again; completed actions are skipped
        and journaled calls replayed.
        """
        outcome = RecordOutcome()
        timer = TimerEntry(key, kind, ts, self.name, partition)
        if self.store.timer(timer) is None:
            return outcome
        first = TimerEvent(kind=kind, timestamp=ts, key=key)
        await self._process(key, timer.seq, partition, first, kind[:1], (kind, ts), outcome)
        await acked(self.store.finish_timer(timer))
        outcome.timer_fired = True
        return outcome

    async def _process(
        self,
        key: str,
        seq: int,
        partition: int,
        first: Event | list[Event],
        tag: str,
        firing: tuple[str, int] | None,
        outcome: RecordOutcome,
        topic: str = "",
        *,
        keyless: bool = False,
        ordinal: int = 0,
    ) -> None:
        """Run the actions of ``first`` and of the events they send, breadth first
        (``ordinal``: actions of this record already run, when it continues a record
        whose first action ran in a batch)."""
        queue: deque[Event] = deque(first) if isinstance(first, list) else deque([first])
        while queue:
            event = queue.popleft()
            for spec in self._listeners(event):
                ref = ActionRef(key, seq, f"{spec.name}#{tag}{ordinal}", partition, topic)
                ref = self.store.resolve(ref)
                ordinal += 1
                done = self.store.done(ref)
                if done is None:
                    done = await self._run_action(
                        spec, event, ref, outcome, firing, keyless=keyless
                    )
                else:
                    outcome.actions_skipped += 1
                    await self._apply_effects_once(done)
                    if not done.emitted and done.outputs:
                        unsent = len(_unsent(done))
                        done = await self._found_in_log(done)
                        left = 0 if done.emitted else len(_unsent(done))
                        outcome.outputs_found += unsent - left
                        outcome.outputs_resent += left
                    await self._emit_once(done, outcome, None)
                queue.extend(self.events_of(done))

    async def _run_action(
        self,
        spec: ActionSpec,
        event: Event,
        ref: ActionRef,
        outcome: RecordOutcome,
        firing: tuple[str, int] | None,
        *,
        keyless: bool = False,
    ) -> ActionDone:
        """Run one action; returns its completion record, acked, outputs sent.

        A keyless record has no memory and no timers: ``ctx.short_term_memory`` and
        ``ctx.timers`` raise :class:`KeylessRecordError` (all keyless records share the
        key ``""``).
        """
        ctx, snapshot, base = self.context(ref, firing, keyless)
        if spec.is_async and spec.in_carrier:
            # In a carrier: the sync ctx.execute inside suspends for its ack.
            await run_coroutine_bridged(spec.fn(event, ctx))
        elif spec.is_async:
            await spec.fn(event, ctx)
        elif spec.in_carrier:
            # On the loop, in a greenlet: journal acks suspend it instead of holding a
            # thread, and its code blocks run in the pool (see durable/bridge.py).
            await run_bridged(spec.fn, event, ctx)
        else:
            spec.fn(event, ctx)  # names no ctx.execute: it has nothing to wait for
        done = self.complete(ref, ctx, snapshot, outcome)
        if not self.changes_key_state(done) and self.sink.threadsafe:
            # The common case in one wait: the outputs go out from the thread that sees
            # ActionDone acked, the emitted marker from the one that sees them acked.
            sends = [(done, ctx.outputs)] if ctx.outputs else []
            _, sent = self.journal_then_send([done], sends, ref.partition)
            try:
                await acked(sent)
            except PartialSendError as exc:
                raise exc.failed[0] from None  # its outputs that landed are marked
            outcome.outputs.extend(ctx.outputs)
            return done
        await self.settle(done, ctx, base, outcome)
        return done

    def context(
        self,
        ref: ActionRef,
        firing: tuple[str, int] | None,
        keyless: bool,
        *,
        fresh: bool = False,
    ) -> tuple[RunnerContext, Callable[[], MemorySnapshot | None], Callable[[], dict[str, bytes]]]:
        """A context for one action run, with the key's snapshot read when the action
        first touches memory (or when its effects are written), not for every action.
        ``fresh``: the store said the record has no journal entry (``store.fresh``), so
        its calls are not looked up."""
        memo: list[MemorySnapshot | None] = []

        def snapshot() -> MemorySnapshot | None:
            if not memo:
                memo.append(None if keyless else self.store.memory(ref.key, ref.partition))
            return memo[0]

        def base() -> dict[str, bytes]:
            found = snapshot()
            return dict(found.values) if found else {}

        ctx = RunnerContext(ref, self.store, self.config, base, firing=firing, fresh=fresh)
        if keyless:  # no memory and no timers: both are per key
            topic = ref.topic or self.topic
            error = lambda: KeylessRecordError(topic, ref.partition, ref.seq)  # noqa: E731
            ctx.short_term_memory = KeylessMemory(error, ctx._guard_fn())
            ctx.timers = Timers(_raiser(error), firing)
        return ctx, snapshot, base

    def complete(
        self,
        ref: ActionRef,
        ctx: RunnerContext,
        snapshot: Callable[[], MemorySnapshot | None],
        outcome: RecordOutcome,
    ) -> ActionDone:
        """The ActionDone of an action that returned (counted in ``outcome``); raises
        OwnershipLost when this member no longer holds the partition the action started
        under (its ActionDone and outputs are the next owner's to produce)."""
        ctx.check_hold()
        outcome.actions_run += 1
        outcome.calls_executed += ctx.executed_calls
        outcome.calls_replayed += ctx.replayed_calls
        memory, timers = ctx._effects()
        memory_updates = tuple(MemoryUpdate(n, v) for n, v in memory.items()) if memory else ()
        changed = bool(memory_updates or timers)
        outputs, sent = ctx.outputs, ctx.sent_events
        return ActionDone(
            ref=ref,
            memory_updates=memory_updates,
            outputs=tuple(map(self.config.codec.encode, outputs)) if outputs else (),
            events=tuple([SentEvent(e.event_name, e.to_payload()) for e in sent]) if sent else (),
            calls=ctx._next_index,
            finished_ms=int(time.time() * 1000),
            emitted=not outputs,
            timers=timers,
            memory_version=_version(snapshot()) + 1 if changed else -1,
        )

    @staticmethod
    def changes_key_state(done: ActionDone) -> bool:
        """Whether ``done`` changes key state (memory or timers)."""
        return bool(done.memory_updates or done.timers)

    async def settle(
        self,
        done: ActionDone,
        ctx: RunnerContext,
        base: Callable[[], dict[str, bytes]],
        outcome: RecordOutcome,
    ) -> None:
        """Append ``done`` (with its key-state effects), wait for the acks, send the
        outputs."""
        if not self.changes_key_state(done):
            await acked(self.store.append([done], done.ref.partition))
        else:
            await self._write_effects(done, base(), first=[done])
        await self._emit_once(done, outcome, ctx.outputs)

    def journal_then_send(
        self,
        dones: list[ActionDone],
        sends: list[tuple[ActionDone, list[Any]]],
        partition: int,
    ) -> tuple[Future[None], Future[None]]:
        """The one way an action's end is written: its ActionDones (one record's, or a
        group's, of ``partition``) in one append, then, once acked, the outputs of
        ``sends`` in one send (:meth:`send_outputs`). Returns the append's ack and the
        whole's. The outputs are produced by the thread that resolves the ack, in its
        callback, before it dispatches any later delivery report: a key's next record
        has its outputs produced after these, whenever the loop hears of this ack."""
        journaled = self.append_dones(dones, partition)
        if not sends:
            return journaled, journaled
        return journaled, then(journaled, partial(self.send_outputs, sends, partition))

    def append_dones(self, dones: list[ActionDone], partition: int) -> Future[None]:
        """The ActionDones of one record or a group's, of ``partition``, in one append:
        those that may travel in a completion group (v7) as groups, one record each
        (:mod:`durable.groups`), the others as ActionDones."""
        if len(dones) < 2:
            return self.store.append(dones, partition)
        groups, alone = grouped_dones(dones, partition)
        if not groups:
            return self.store.append(dones, partition)
        appended = [self.store.append_group(group) for group in groups]
        if alone:
            appended.append(self.store.append(alone, partition))
        return all_of(appended)

    def send_outputs(
        self, sends: list[tuple[ActionDone, list[Any]]], partition: int
    ) -> Future[None]:
        """The outputs of acked ActionDones of ``partition`` (one record's, or a group
        commit's) in one send; once they are acked, their emitted markers in one append
        (not awaited: a lost marker only means the outputs may be sent once more)."""
        if FAULT_POINTS:
            fault_reached("outputs")
        stored = self.sends_stored
        sent = self.sink.send_batch(
            [
                SinkItem(done.ref.key, values, partition, done.outputs if stored else None, done)
                for done, values in sends
            ]
        )
        if self.emitted_markers:
            dones = [done for done, _ in sends]
            sent.add_done_callback(partial(self._mark_emitted, dones, partition))
        return sent

    def _send(self, done: ActionDone, values: list[Any]) -> Future[None]:
        """Send those of ``done``'s outputs not known to be in the log already."""
        stored: Sequence[bytes] = done.outputs
        unsent = None
        if done.emitted_outputs:  # a send of them partly failed before: not those again
            unsent = _unsent(done)
            values = [values[i] for i in unsent]
            stored = [stored[i] for i in unsent]
        return self.sink.send(
            done.ref.key,
            values,
            done.ref.partition,
            stored if self.sends_stored else None,
            done=done,
            indexes=unsent,
        )

    def _mark_emitted(self, dones: list[ActionDone], partition: int, sent: Future[None]) -> None:
        exc = sent.exception()
        if isinstance(exc, PartialSendError):  # the others' outputs are durable
            marks = [
                _emitted(done)
                if position not in exc.failed
                else _partly_emitted(done, exc.landed[position])
                for position, done in enumerate(dones)
                if position not in exc.failed or exc.landed.get(position)
            ]
        elif exc is not None:
            return
        else:
            marks = [_emitted(done) for done in dones]
        if marks:
            self.store.note(marks, partition)

    async def _write_effects(
        self, done: ActionDone, base: dict[str, bytes], *, first: list[JournalEntry]
    ) -> None:
        """Append ``first``, the timer writes, then the snapshot (in this order), await
        the acks, and report new registrations to the host."""
        writes, cleanups, registered = self._timer_writes(done)
        snapshot = self._next_snapshot(done, base)
        appended = self.store.append([*first, *writes, snapshot], done.ref.partition)
        await acked(all_of([*cleanups, appended]))
        if registered and self.on_timers is not None:
            self.on_timers(registered)

    def _timer_writes(
        self, done: ActionDone
    ) -> tuple[list[TimerEntry | Tombstone], list[Future[None]], list[TimerEntry]]:
        """Timer records of ``done``. A timer registered while not live, or deleted, has
        any entries of an earlier (orphaned) firing tombstoned first, so that its next
        firing cannot meet a stale ActionDone."""
        writes: list[TimerEntry | Tombstone] = []
        cleanups: list[Future[None]] = []
        registered: list[TimerEntry] = []
        for update in done.timers:
            timer = TimerEntry(done.ref.key, update.kind, update.ts, self.name, done.ref.partition)
            live = self.store.timer(timer) is not None
            if update.deleted:
                if live:
                    writes.append(Tombstone(entry_key(timer)))
                cleanups.append(self.store.forget_firing(timer))
            else:
                if not live:
                    cleanups.append(self.store.forget_firing(timer))
                    writes.append(timer)
                registered.append(timer)
        return writes, cleanups, registered

    def _next_snapshot(self, done: ActionDone, base: dict[str, bytes]) -> MemorySnapshot:
        updates = {u.name: u.value for u in done.memory_updates}
        return MemorySnapshot(
            key=done.ref.key,
            values=apply_updates(base, updates),
            applied_seq=done.ref.seq,
            applied_ordinal=done.ordinal,
            partition=done.ref.partition,
            version=done.memory_version,
        )

    async def _apply_effects_once(self, done: ActionDone) -> None:
        """Recovery of a completed action: re-write its memory and timer effects unless
        the key's snapshot shows they are durable."""
        if not done.memory_updates and not done.timers:
            return
        snapshot = self.store.memory(done.ref.key, done.ref.partition)
        if _applied(snapshot, done):
            return
        if done.memory_version < 0:  # written before v4: version it now
            done = replace(done, memory_version=_version(snapshot) + 1)
        base = dict(snapshot.values) if snapshot else {}
        await self._write_effects(done, base, first=[])

    async def _found_in_log(self, done: ActionDone) -> ActionDone:
        """``done`` (not marked emitted) with the outputs the sink finds in the log
        already counted as emitted (a worker died after they were acked, before the
        marker was), and that mark noted."""
        if not self.sink.finds_outputs:
            return done
        landed = self.sink.landed
        unsent = _unsent(done)
        backoff = LOOKUP_RETRY_FIRST
        ownership, ref = self.config.ownership, done.ref
        lease = ownership.lease(ref.topic, ref.partition) if ownership is not None else 0
        while True:
            try:
                found = await asyncio.to_thread(landed, done, unsent)
                break
            except Exception as exc:
                if not self.transactional:  # cannot tell: send them (at least once)
                    log.warning(
                        "outputs of key=%r seq=%s action=%s not looked up in the output "
                        "topic, sending them again: %s",
                        done.ref.key,
                        done.ref.seq,
                        done.ref.action,
                        exc,
                    )
                    return done
                # Exactly-once: they may be in a committed transaction already (the
                # ActionDone committed in one, the outputs in the next, the offset in
                # neither), so the lookup is waited out (a leader moving, a broker
                # restarting) while the partition is held; a lost hold ends the wait.
                log.warning(
                    "outputs of key=%r seq=%s action=%s not looked up in the output "
                    "topic yet, retrying in %.1fs (exactly-once: not sent again unseen): %s",
                    done.ref.key,
                    done.ref.seq,
                    done.ref.action,
                    backoff,
                    exc,
                )
                await asyncio.sleep(backoff)
                backoff = min(LOOKUP_RETRY_MAX, backoff * 2)
                if ownership is not None:
                    ownership.check(ref.topic, ref.partition, lease)
        if not found:
            return done
        marked = _partly_emitted(done, [unsent.index(j) for j in found])
        if len(marked.emitted_outputs) == len(done.outputs):
            marked = _emitted(done)
        self.store.note([marked], done.ref.partition)
        return marked

    async def _emit_once(
        self, done: ActionDone, outcome: RecordOutcome, values: list[Any] | None
    ) -> None:
        """Send ``done``'s outputs unless marked emitted (``values``: already decoded)."""
        if values is None:
            values = [self.config.codec.decode(v) for v in done.outputs]
        outcome.outputs.extend(values)
        if done.emitted:
            return
        try:
            await acked(self._send(done, values))
        except PartialSendError as exc:
            if exc.landed.get(0):
                self.store.note([_partly_emitted(done, exc.landed[0])], done.ref.partition)
            raise exc.failed[0] from None
        # Not awaited: a lost marker only means the outputs may be sent once more.
        self.store.note([_emitted(done)], done.ref.partition)

    def events_of(self, done: ActionDone) -> list[Event]:
        events = []
        for sent in done.events:
            cls = Event.lookup(sent.type)
            if cls is None:
                raise EventError(
                    f"journaled event type {sent.type!r} of key={done.ref.key!r} "
                    f"seq={done.ref.seq} action={done.ref.action} is not defined in this worker"
                )
            events.append(cls.from_payload(sent.payload))
        return events


def input_event(record: RecordInput) -> InputEvent:
    return InputEvent(
        input=record.value,
        key=record.key,
        partition=record.partition,
        offset=record.seq,
        timestamp=record.timestamp,
        headers=record.headers,
    )


def _emitted(done: ActionDone) -> ActionDone:
    """``replace(done, emitted=True)`` without re-running the dataclass constructor (once
    per action with outputs, on the hot path). The copy keeps what the journal codec
    cached on ``done``, so that the marker's bytes are the ActionDone's with one byte
    flipped (``serde.journal._flip_emitted``)."""
    marked: ActionDone = object.__new__(ActionDone)
    marked.__dict__.update(done.__dict__, emitted=True)
    return marked


def _unsent(done: ActionDone) -> list[int]:
    """Indexes of ``done``'s outputs not known to be in the log, in send order."""
    known = set(done.emitted_outputs)
    return [i for i in range(len(done.outputs)) if i not in known]


def _partly_emitted(done: ActionDone, landed: Sequence[int]) -> ActionDone:
    """``done`` (not emitted) noting that the outputs at ``landed`` of those its last
    send sent (:func:`_unsent`) reached the log."""
    unsent = _unsent(done)
    known = set(done.emitted_outputs).union(unsent[i] for i in landed)
    return replace(done, emitted=False, emitted_outputs=tuple(sorted(known)))


def _version(snapshot: MemorySnapshot | None) -> int:
    return snapshot.version if snapshot is not None else -1


def _applied(snapshot: MemorySnapshot | None, done: ActionDone) -> bool:
    """Whether ``snapshot`` already includes the effects of ``done``.

    Versioned records (v4+) compare key-state versions, which stay ordered when timer
    firings (negative seq) interleave with input records; older ones fall back to the
    (seq, ordinal) order of input records.
    """
    if snapshot is None:
        return False
    if snapshot.version >= 0 and done.memory_version >= 0:
        return snapshot.version >= done.memory_version
    return (snapshot.applied_seq, snapshot.applied_ordinal) >= (done.ref.seq, done.ordinal)
