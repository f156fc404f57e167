"""The lane record path (durable/lane.py) has the per-record path's effects.

Reference model: the same records run one by one through ``ActionRunner.run`` on a store
holding the same journal. Records do 0-3 durable calls, may raise (in the body or in a
code block), write memory, send an event to a second action, emit outputs, or find
their ActionDone already journaled (recovery). Journals must match entry for entry
(timestamps aside), and so must outputs and what each record reports.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream import Agent, Event, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.ackfuture import resolved
from agents_stream.durable import bridge
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.journal import ActionDone, CallEntry
from agents_stream.durable.lane import run_records
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput, RecordOutcome
from agents_stream.durable.sink import Sink as BaseSink
from agents_stream.state.memory import InMemoryActionStateStore

POOL = ThreadPoolExecutor(4)


class Boom(Exception):
    pass


@dataclasses.dataclass
class Followed(Event):
    n: int = 0


def lookup(n: int) -> int:
    if n < 0:
        raise Boom(f"code block refused {n}")
    return n + 1


class Planned(Agent):
    """Does what the record's value says."""

    @action(InputEvent)
    @staticmethod
    def first(event: InputEvent, ctx: RunnerContext) -> None:
        n = 0
        for arg in call_args(event.input):
            try:
                n = ctx.execute(lookup, n if arg is None else arg)
            except Boom:
                n = 100
        conclude(event, ctx, n)

    @action(Followed)
    @staticmethod
    def second(event: Followed, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output={"followed": event.n}))


class PlannedAsync(Agent):
    """Planned, as an async action (its first action runs on a task of its own)."""

    @action(InputEvent)
    @staticmethod
    async def first(event: InputEvent, ctx: RunnerContext) -> None:
        n = 0
        for arg in call_args(event.input):
            try:
                n = await ctx.execute_async(lookup, n if arg is None else arg)
            except Boom:
                n = 100
        conclude(event, ctx, n)

    second = action(Followed)(staticmethod(Planned.second))


def call_args(plan: dict[str, Any]) -> list[int | None]:
    """Arguments of the planned calls (None: the previous result); the last one fails in
    its code block when the plan says so."""
    args: list[int | None] = [None] * plan["calls"]
    if plan["block_fails"] and args:
        args[-1] = -1
    return args


def conclude(event: InputEvent, ctx: RunnerContext, n: int) -> None:
    plan = event.input
    if plan["memory"]:
        ctx.short_term_memory.set("n", (ctx.short_term_memory.get("n") or 0) + n)
    if plan["follow"]:
        ctx.send_event(Followed(n=n))
    if plan["raises"]:
        raise Boom(f"action refused {event.key}")
    for j in range(plan["outputs"]):
        ctx.send_event(OutputEvent(output={"key": event.key, "n": n, "j": j}))


class Sink(BaseSink):
    threadsafe = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def send(self, key: str, values: Any, partition: int, *args: Any, **kw: Any) -> Future[None]:
        self.sent.extend((key, v) for v in values)
        return resolved()


plans = st.fixed_dictionaries(
    {
        "calls": st.integers(0, 3),
        "block_fails": st.booleans(),
        "memory": st.booleans(),
        "follow": st.booleans(),
        "raises": st.booleans(),
        "outputs": st.integers(0, 2),
        "journaled": st.booleans(),  # its ActionDone is in the journal already
    }
)


def runner_for(
    store: InMemoryActionStateStore, sink: Sink, agent: type[Agent] = Planned
) -> ActionRunner:
    config = ContextConfig("app", "w", JSON, executor=POOL)
    return ActionRunner(agent, store, config, sink, topic="in")


def normalised(store: InMemoryActionStateStore) -> dict[Any, Any]:
    out = {}
    for identity, entry in store._entries.items():
        if isinstance(entry, ActionDone):
            entry = dataclasses.replace(entry, finished_ms=0)
        elif isinstance(entry, CallEntry):
            entry = dataclasses.replace(entry, started_ms=0, finished_ms=0, worker_id="")
        out[identity] = entry
    return out


def outcome_view(result: RecordOutcome | Exception) -> Any:
    if isinstance(result, Exception):
        return (type(result).__name__, str(result))
    return dataclasses.asdict(result)


def records_for(batch: list[dict[str, Any]]) -> list[RecordInput]:
    return [RecordInput(f"k{i}", 10 + i, plan, partition=0) for i, plan in enumerate(batch)]


def prepared_store(records: list[RecordInput], agent: type[Agent]) -> InMemoryActionStateStore:
    """A journal holding the ActionDones of the records marked ``journaled``."""
    store = InMemoryActionStateStore()
    runner = runner_for(store, Sink(), agent)

    async def prerun() -> None:
        for record in records:
            if record.value["journaled"]:
                try:
                    await runner.run(record)
                except Boom:
                    pass

    asyncio.run(prerun())
    return store


@settings(max_examples=80, deadline=None)
@given(st.lists(plans, min_size=1, max_size=12), st.sampled_from([Planned, PlannedAsync]))
def test_a_batch_has_the_effects_of_running_its_records_one_by_one(
    batch: list[dict[str, Any]], agent: type[Agent]
) -> None:
    records = records_for(batch)
    one_store, one_sink = prepared_store(records, agent), Sink()
    batch_store, batch_sink = prepared_store(records, agent), Sink()

    async def one_by_one() -> list[Any]:
        runner, results = runner_for(one_store, one_sink, agent), []
        for record in records:
            try:
                results.append(outcome_view(await runner.run(record)))
            except Exception as exc:
                results.append(outcome_view(exc))
        return results

    async def batched() -> list[Any]:
        reported: dict[int, Any] = {}

        def report(index: int, result: RecordOutcome | Exception) -> None:
            assert index not in reported, "a record was reported twice"
            reported[index] = outcome_view(result)

        await run_records(runner_for(batch_store, batch_sink, agent), records, report)
        return [reported[i] for i in range(len(records))]

    assert asyncio.run(batched()) == asyncio.run(one_by_one())
    assert normalised(batch_store) == normalised(one_store)
    assert sorted(map(repr, batch_sink.sent)) == sorted(map(repr, one_sink.sent))


def test_records_are_reported_as_they_finish_and_share_one_append() -> None:
    """Records without calls finish in the first round: one append for all of them;
    a record whose call waits is reported later, on its own."""
    plain = {"calls": 0, "block_fails": False, "memory": False, "follow": False}
    plain |= {"raises": False, "outputs": 1, "journaled": False}
    records = records_for([plain, plain, {**plain, "calls": 1}, plain])
    store = InMemoryActionStateStore()
    appends: list[int] = []
    original = store.append

    def counting(entries: Any, partition: int) -> Future[None]:
        appends.append(len(entries))
        return original(entries, partition)

    store.append = counting  # type: ignore[method-assign]
    order: list[int] = []

    async def main() -> None:
        await run_records(runner_for(store, Sink()), records, lambda i, r: order.append(i))

    asyncio.run(main())
    assert appends[0] == 3  # the three ActionDones of the first round, in one append
    assert sorted(order) == [0, 1, 2, 3] and order[-1] == 2


def slow_block() -> None:
    time.sleep(0.5)


class Waits(Agent):
    unwound: list[str] = []

    @action(InputEvent)
    @staticmethod
    def first(event: InputEvent, ctx: RunnerContext) -> None:
        try:
            ctx.execute(slow_block)
        finally:
            Waits.unwound.append(event.key)


def test_a_cancelled_batch_unwinds_its_waiting_actions_and_reports_nothing() -> None:
    async def main() -> None:
        config = ContextConfig("app", "w", JSON, executor=POOL)
        runner = ActionRunner(Waits, InMemoryActionStateStore(), config, Sink(), topic="in")
        records = [RecordInput(f"k{i}", i, None) for i in range(3)]
        reported: list[int] = []
        task = asyncio.ensure_future(run_records(runner, records, lambda i, r: reported.append(i)))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert reported == []  # the controller abandons them: never committed

    asyncio.run(main())
    assert sorted(Waits.unwound) == ["k0", "k1", "k2"]


class Remembers(Agent):
    contexts: list[Any] = []

    @action(InputEvent)
    @staticmethod
    def first(event: InputEvent, ctx: RunnerContext) -> None:
        Remembers.contexts.append(weakref.ref(ctx))
        ctx.execute(lookup, 1)  # waits: many carriers are suspended at once
        if event.input % 7 == 0:
            raise Boom("an error's traceback must not keep its context either")


def test_finished_actions_leave_nothing_behind_in_idle_carriers() -> None:
    """Carriers are reused; an idle one must not keep its last action's event, context
    or error alive (a worker's memory grew with every record before)."""
    bridge.MAX_IDLE, saved = 3, bridge.MAX_IDLE  # most carriers are ended on release

    async def main() -> None:
        config = ContextConfig("app", "w", JSON, executor=POOL)
        runner = ActionRunner(Remembers, InMemoryActionStateStore(), config, Sink(), topic="in")
        records = [RecordInput(f"k{i}", i, i) for i in range(40)]
        await run_records(runner, records, lambda i, r: None)

    try:
        asyncio.run(main())
    finally:
        bridge.MAX_IDLE = saved
    gc.collect()
    assert len(Remembers.contexts) == 40
    assert [ref for ref in Remembers.contexts if ref() is not None] == []


class Plain(Agent):
    contexts: list[weakref.ref[RunnerContext]] = []

    @action(InputEvent)
    @staticmethod
    def first(event: InputEvent, ctx: RunnerContext) -> None:
        Plain.contexts.append(weakref.ref(ctx))
        if event.input % 2:
            ctx.execute(lookup, 1)
        ctx.send_event(OutputEvent(output={"n": event.input}))


def test_a_finished_record_is_freed_by_reference_counting() -> None:
    """No reference cycle per record: a context (with its memory, timers and closures)
    is freed when its record finishes, not left for the cyclic collector (which, with
    ~18 such objects a record, took 15 % of a worker's time)."""

    async def main() -> None:
        config = ContextConfig("app", "w", JSON, executor=POOL)
        runner = ActionRunner(Plain, InMemoryActionStateStore(), config, Sink(), topic="in")
        records = [RecordInput(f"k{i}", i, i) for i in range(40)]
        await run_records(runner, records, lambda i, r: None)
        assert [ref for ref in Plain.contexts if ref() is not None] == []

    gc.collect()
    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()
    assert len(Plain.contexts) == 40


def test_a_key_is_released_once_its_outputs_are_sent_and_reported_once_they_are_acked() -> None:
    """``released``: the next record of the key may start once the ActionDone is acked
    and the outputs are produced (nothing later can reorder them); the record is
    reported finished (committable) only once the outputs are acked."""
    plain = {"calls": 0, "block_fails": False, "memory": False, "follow": False}
    plain |= {"raises": False, "outputs": 1, "journaled": False}
    records = records_for([plain, plain])
    acks: list[Future[None]] = []

    class SlowSink(Sink):
        def send(self, key: str, values: Any, partition: int, *a: Any, **kw: Any) -> Future[None]:
            super().send(key, values, partition)
            acks.append(Future())
            return acks[-1]

    sink, events = SlowSink(), []

    async def main() -> None:
        def released(indices: list[int]) -> None:
            events.extend(("released", index, len(sink.sent)) for index in indices)

        def report(index: int, result: Any) -> None:
            events.append(("reported", index, len(sink.sent)))

        runner = runner_for(InMemoryActionStateStore(), sink)
        task = asyncio.ensure_future(run_records(runner, records, report, released))
        for _ in range(20):
            await asyncio.sleep(0)
        assert sorted(events) == [("released", 0, 2), ("released", 1, 2)]
        for ack in acks:
            ack.set_result(None)
        await task

    asyncio.run(main())
    assert sorted(events[2:]) == [("reported", 0, 2), ("reported", 1, 2)]


def reported(runner: ActionRunner, records: list[RecordInput]) -> dict[int, str]:
    """Runs ``records`` as one batch: what each one reported ("finished" or the type of
    its error)."""
    reports: dict[int, str] = {}

    def report(index: int, outcome: object) -> None:
        reports[index] = type(outcome).__name__

    def finished(pairs: list[tuple[int, RecordOutcome]]) -> None:
        reports.update((index, "finished") for index, _ in pairs)

    asyncio.run(run_records(runner, records, report, None, finished))
    return reports


class _RefusingStore(InMemoryActionStateStore):
    """Refuses, as the producer does synchronously, any append holding a "huge" output
    (an ActionDone over ``message.max.bytes``)."""

    def append(self, entries, partition):  # type: ignore[no-untyped-def]
        for entry in entries:
            if any(b"huge" in out for out in getattr(entry, "outputs", ())):
                raise Boom("MSG_SIZE_TOO_LARGE")
        return super().append(entries, partition)


class _Echo(Agent):
    @action(InputEvent)
    @staticmethod
    def first(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=event.input))


def test_an_append_refused_at_once_fails_only_its_record_and_the_batch_reports_the_rest() -> None:
    """A group append that raises (before anything is sent) must not escape the batch:
    then no record of it was reported, and the partition's commits stayed behind them for
    good. Each record is appended on its own instead, and only the refused one fails
    (for the error policy: dead letter or stop)."""
    store = _RefusingStore()
    runner = ActionRunner(_Echo, store, ContextConfig("app", "w", JSON), topic="in")
    records = [
        RecordInput(key=f"k{i}", seq=i, value="huge" if i == 2 else f"v{i}") for i in range(4)
    ]
    reports = reported(runner, records)
    assert reports == {0: "finished", 1: "finished", 2: "Boom", 3: "finished"}
    done = {e.ref.seq for e in store.entries() if isinstance(e, ActionDone)}
    assert done == {0, 1, 3}


class _BrokerRefusingStore(InMemoryActionStateStore):
    """The broker refuses (asynchronously) any append holding a "huge" output: an
    ActionDone over the topic's max.message.bytes fails its whole group's ack."""

    def append(self, entries, partition):  # type: ignore[no-untyped-def]
        from agents_stream.ackfuture import AckFuture
        from agents_stream.errors import RecordRefusedError

        if any(b"huge" in out for e in entries for out in getattr(e, "outputs", ())):
            refused: AckFuture[None] = AckFuture()
            refused.set_exception(RecordRefusedError("MESSAGE_TOO_LARGE", code=10))
            return refused
        return super().append(entries, partition)


def test_a_group_the_broker_refuses_for_one_record_fails_only_that_record() -> None:
    store = _BrokerRefusingStore()
    runner = ActionRunner(_Echo, store, ContextConfig("app", "w", JSON), topic="in")
    records = [
        RecordInput(key=f"k{i}", seq=i, value="huge" if i == 1 else f"v{i}") for i in range(4)
    ]
    reports = reported(runner, records)
    assert reports == {0: "finished", 1: "RecordRefusedError", 2: "finished", 3: "finished"}
    done = {e.ref.seq for e in store.entries() if isinstance(e, ActionDone)}
    assert done == {0, 2, 3}


class _PartlyRefusingSink(Sink):
    """Sends a batch's outputs together; the log refuses the "huge" ones (as the
    broker does, after the others of the batch are written)."""

    takes_stored = False

    def send_batch(self, outputs):  # type: ignore[no-untyped-def]
        from agents_stream.ackfuture import AckFuture
        from agents_stream.errors import PartialSendError, RecordRefusedError

        failed = {}
        for position, (key, values, *_) in enumerate(outputs):
            if "huge" in values:
                failed[position] = RecordRefusedError("MESSAGE_TOO_LARGE", code=10)
            else:
                self.sent.extend((key, v) for v in values)
        fut: AckFuture[None] = AckFuture()
        if failed:
            fut.set_exception(PartialSendError(failed))
        else:
            fut.set_result(None)
        return fut


def test_outputs_refused_for_one_record_fail_only_that_record() -> None:
    """The outputs of a group commit go out together; when the log refuses one record's,
    the others are durable: those records finish (and are marked emitted, so a replay
    does not send them again), only the refused one fails."""
    store, sink = InMemoryActionStateStore(), _PartlyRefusingSink()
    runner = ActionRunner(_Echo, store, ContextConfig("app", "w", JSON), sink, topic="in")
    records = [RecordInput(key=f"k{i}", seq=i, value=f"v{i}") for i in range(5)]
    records[3] = RecordInput(key="k3", seq=3, value="huge")
    reports = reported(runner, records)
    assert reports == {i: "finished" for i in (0, 1, 2, 4)} | {3: "RecordRefusedError"}
    emitted = {e.ref.seq: e.emitted for e in store.entries() if isinstance(e, ActionDone)}
    assert emitted == {0: True, 1: True, 2: True, 3: False, 4: True}
    assert sorted(sink.sent) == [(f"k{i}", f"v{i}") for i in (0, 1, 2, 4)]
