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
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..agent import ActionSpec, Agent
from ..events import Event, EventError, InputEvent
from ..state.base import ActionStateStore
from .context import ContextConfig, RunnerContext
from .journal import ActionDone, ActionRef, MemorySnapshot, MemoryUpdate, SentEvent
from .memory import apply_updates


class OutputSink(Protocol):
    def send(self, key: str, values: Sequence[Any], partition: int) -> Future[None]:
        """Send ``values`` downstream; the future resolves when they are durable."""
        ...


class NullSink:
    def send(self, key: str, values: Sequence[Any], partition: int) -> Future[None]:
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


@dataclass
class RecordInput:
    key: str
    seq: int
    value: Any
    partition: int = 0
    timestamp: int | None = None
    headers: dict[str, bytes] = field(default_factory=dict)


@dataclass
class RecordOutcome:
    actions_run: int = 0
    actions_skipped: int = 0
    calls_executed: int = 0
    calls_replayed: int = 0
    outputs: list[Any] = field(default_factory=list)


class ActionRunner:
    def __init__(
        self,
        agent: type[Agent],
        store: ActionStateStore,
        config: ContextConfig,
        sink: OutputSink | None = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.config = config
        self.sink = sink or NullSink()
        self._actions = agent.actions()

    def _listeners(self, event: Event) -> list[ActionSpec]:
        return [a for a in self._actions if isinstance(event, a.listens)]

    async def run(self, record: RecordInput) -> RecordOutcome:
        outcome = RecordOutcome()
        first = InputEvent(
            input=record.value,
            key=record.key,
            partition=record.partition,
            offset=record.seq,
            timestamp=record.timestamp,
            headers=record.headers,
        )
        queue: deque[Event] = deque([first])
        ordinal = 0
        while queue:
            event = queue.popleft()
            for spec in self._listeners(event):
                ref = ActionRef(record.key, record.seq, f"{spec.name}#{ordinal}", record.partition)
                ordinal += 1
                done = self.store.done(ref)
                if done is None:
                    done = await self._run_action(spec, event, ref, outcome)
                else:
                    outcome.actions_skipped += 1
                    self._apply_memory_once(done)
                await self._emit_once(done, outcome)
                queue.extend(self._rebuild_events(done))
        return outcome

    async def _run_action(
        self, spec: ActionSpec, event: Event, ref: ActionRef, outcome: RecordOutcome
    ) -> ActionDone:
        snapshot = self.store.memory(ref.key, ref.partition)
        base = dict(snapshot.values) if snapshot else {}
        ctx = RunnerContext(ref, self.store, self.config, base)
        if spec.is_async:
            await spec.fn(event, ctx)
        else:
            # Sync actions run off the loop so that other keys keep flowing; the context
            # is copied so the code-block guard stays per action.
            run = contextvars.copy_context().run
            await asyncio.get_running_loop().run_in_executor(
                self.config.executor, run, spec.fn, event, ctx
            )
        outcome.actions_run += 1
        outcome.calls_executed += ctx.executed_calls
        outcome.calls_replayed += ctx.replayed_calls
        done = ActionDone(
            ref=ref,
            memory_updates=tuple(
                MemoryUpdate(n, v) for n, v in ctx.short_term_memory.updates.items()
            ),
            outputs=tuple(self.config.codec.encode(v) for v in ctx.outputs),
            events=tuple(SentEvent(e.event_name, e.to_payload()) for e in ctx.sent_events),
            calls=ctx._next_index,
            finished_ms=int(time.time() * 1000),
            emitted=not ctx.outputs,
        )
        entries: list[Any] = [done]
        if done.memory_updates:
            entries.append(self._next_snapshot(done, base))
        await asyncio.wrap_future(self.store.append(entries, ref.partition))
        return done

    def _next_snapshot(self, done: ActionDone, base: dict[str, bytes]) -> MemorySnapshot:
        updates = {u.name: u.value for u in done.memory_updates}
        return MemorySnapshot(
            key=done.ref.key,
            values=apply_updates(base, updates),
            applied_seq=done.ref.seq,
            applied_ordinal=done.ordinal,
            partition=done.ref.partition,
        )

    def _apply_memory_once(self, done: ActionDone) -> None:
        if not done.memory_updates:
            return
        snapshot = self.store.memory(done.ref.key, done.ref.partition)
        if snapshot is not None and (snapshot.applied_seq, snapshot.applied_ordinal) >= (
            done.ref.seq,
            done.ordinal,
        ):
            return
        base = dict(snapshot.values) if snapshot else {}
        self.store.append([self._next_snapshot(done, base)], done.ref.partition).result()

    async def _emit_once(self, done: ActionDone, outcome: RecordOutcome) -> None:
        values = [self.config.codec.decode(v) for v in done.outputs]
        outcome.outputs.extend(values)
        if done.emitted:
            return
        await asyncio.wrap_future(self.sink.send(done.ref.key, values, done.ref.partition))
        # Not awaited: a lost marker only means the outputs may be sent once more.
        self.store.append([replace(done, emitted=True)], done.ref.partition)

    def _rebuild_events(self, done: ActionDone) -> list[Event]:
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
