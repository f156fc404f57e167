"""Ownership: leases, fencing and the freeze watchdog, and how the record path obeys them
(no code block starts, nothing is journaled, no memory from foreign threads)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from agents_stream import Agent, CodeBlockViolation, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable import ContextConfig
from agents_stream.durable.ownership import Ownership, OwnershipLost
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.state import InMemoryActionStateStore

TOPIC = "orders"


def test_a_new_hold_gets_a_new_generation_and_old_leases_fail():
    own = Ownership()
    first = own.lease(TOPIC, 0)
    assert first == 0 and not own.valid(TOPIC, 0, first)  # never held
    gen1 = own.acquire(TOPIC, 0)
    assert own.lease(TOPIC, 0) == gen1 and own.valid(TOPIC, 0, gen1) and own.holds(0)
    assert own.release(TOPIC, 0) and not own.release(TOPIC, 0)
    assert not own.valid(TOPIC, 0, gen1) and not own.holds(0)
    gen2 = own.acquire(TOPIC, 0)
    assert gen2 != gen1 and own.valid(TOPIC, 0, gen2)
    assert not own.valid(TOPIC, 0, gen1)  # work of the first hold stays fenced


def test_a_journal_partition_is_held_while_any_input_topic_holds_it():
    own = Ownership()
    own.acquire("a", 3)
    own.acquire("b", 3)
    own.release("a", 3)
    assert own.holds(3) and own.valid("", 3, own.lease("", 3))
    own.release("b", 3)
    assert not own.holds(3)
    with pytest.raises(OwnershipLost, match="partition 3"):
        own.check_partition(3, "output")


def test_a_freeze_fails_every_check_before_the_watchdog_beats_again():
    own = Ownership(freeze_after=0.05)
    lease = own.acquire(TOPIC, 0)
    own.beat()
    time.sleep(0.12)  # as if SIGSTOPped: no beat
    # Any thread resuming first is refused on its own, before the watchdog runs.
    assert not own.valid(TOPIC, 0, lease) and not own.holds(0)
    gap = own.beat()
    assert gap > 0.05 and own.suspended is not None and "frozen" in own.suspended
    assert not own.valid(TOPIC, 0, lease)  # the new beat does not lift the suspension
    own.resume()  # the group confirmed the hold
    assert own.valid(TOPIC, 0, lease)


class TwoCalls(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        for i in range(2):
            ctx.execute(step, event.input, i)
        ctx.send_event(OutputEvent(output=event.input))


class TwoCallsAsync(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        for i in range(2):
            await ctx.execute_async(step, event.input, i)
        ctx.send_event(OutputEvent(output=event.input))


STARTED: list[int] = []
OWNERSHIP = Ownership()


def step(n: int, i: int) -> int:
    STARTED.append(i)
    if i == 0:
        OWNERSHIP.release(TOPIC, 0)  # the partition is lost while the first call runs
    return n


class FencedStore(InMemoryActionStateStore):
    """The Kafka store's rule (state/kafka.py): no journal write for a partition not held."""

    def append(self, entries, partition):
        OWNERSHIP.check_partition(partition, "journal write")
        return super().append(entries, partition)


@pytest.mark.parametrize("agent", [TwoCalls, TwoCallsAsync])
def test_a_lost_partition_starts_no_further_code_block_and_journals_nothing(agent):
    STARTED.clear()
    OWNERSHIP.acquire(TOPIC, 0)
    store = FencedStore()
    pool = ThreadPoolExecutor(2)
    config = ContextConfig(
        app_id="t", worker_id="w", codec=JSON, executor=pool, ownership=OWNERSHIP
    )
    runner = ActionRunner(agent, store, config, topic=TOPIC)
    try:
        with pytest.raises(OwnershipLost):
            asyncio.run(runner.run(RecordInput("k", 7, 7, partition=0)))
    finally:
        pool.shutdown()
    assert STARTED == [0]  # the second code block never started
    assert store.entries() == []  # not the first result, not an ActionDone


async def coro_step(n: int) -> int:
    STARTED.append(n)
    return n


class CoroutineCall(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        await ctx.execute_async(coro_step, event.input)


def test_a_coroutine_code_block_waits_out_a_stalled_journal_on_the_loop():
    """A coroutine code block starts on the loop's thread, where Ownership.admit cannot
    block: it waits in admit_async while the journal is stalled (runtime/connectivity.py)
    and starts once the broker answers."""
    STARTED.clear()
    own = Ownership()
    own.acquire(TOPIC, 0)
    own.stalled = True
    store = InMemoryActionStateStore()
    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, ownership=own)
    runner = ActionRunner(CoroutineCall, store, config, topic=TOPIC)

    async def scenario() -> None:
        run = asyncio.create_task(runner.run(RecordInput("k", 7, 7, partition=0)))
        await asyncio.sleep(0.2)
        assert STARTED == [] and not run.done()  # held while stalled
        own.stalled = False
        await asyncio.wait_for(run, 5)

    asyncio.run(scenario())
    assert STARTED == [7]


def test_a_pool_thread_checks_the_lease_when_it_takes_the_call_not_when_queued():
    own = Ownership()
    own.acquire(TOPIC, 0)
    release = threading.Event()
    pool = ThreadPoolExecutor(1)
    blocker = pool.submit(release.wait, 5)  # the only thread is busy: the call queues
    ran: list[int] = []

    class One(Agent):
        @action(InputEvent)
        @staticmethod
        def process(event: InputEvent, ctx: RunnerContext) -> None:
            ctx.execute(ran.append, 1)

    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, executor=pool, ownership=own)
    runner = ActionRunner(One, InMemoryActionStateStore(), config, topic=TOPIC)

    async def main() -> None:
        run = asyncio.ensure_future(runner.run(RecordInput("k", 1, 1, partition=0)))
        await asyncio.sleep(0.05)  # the call is queued behind the blocker
        own.release(TOPIC, 0)
        release.set()
        with pytest.raises(OwnershipLost):
            await run

    try:
        asyncio.run(main())
    finally:
        blocker.result()
        pool.shutdown()
    assert ran == []


class ThreadWrites(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.short_term_memory.set("own", 1)  # the action body: allowed
        ctx.execute(spawn_writer, ctx)
        ctx.send_event(OutputEvent(output=ctx.short_term_memory.get("from_thread")))


ERRORS: list[BaseException] = []


def spawn_writer(ctx: RunnerContext) -> int:
    def write() -> None:
        try:
            ctx.short_term_memory.set("from_thread", 1)
        except BaseException as exc:
            ERRORS.append(exc)

    t = threading.Thread(target=write)
    t.start()
    t.join()
    return 1


def test_memory_written_by_a_thread_a_code_block_started_is_refused_and_not_applied(
    monkeypatch,
):
    ERRORS.clear()
    # The context itself is an argument here only to reach it from the thread: the
    # journaled value domain refuses it, so the digest is stubbed for this test.
    monkeypatch.setattr("agents_stream.durable.context.args_digest", lambda a, k: "d")
    store = InMemoryActionStateStore()
    pool = ThreadPoolExecutor(2)
    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, executor=pool)
    runner = ActionRunner(ThreadWrites, store, config, topic=TOPIC)
    try:
        outcome = asyncio.run(runner.run(RecordInput("k", 1, 1)))
    finally:
        pool.shutdown()
    assert len(ERRORS) == 1 and isinstance(ERRORS[0], CodeBlockViolation)
    assert outcome.outputs == [None]
    [done] = [e for e in store.entries() if type(e).__name__ == "ActionDone"]
    assert [u.name for u in done.memory_updates] == ["own"]


# -- a reference model ------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PARTS = [("a", 0), ("a", 1), ("b", 0), ("", 0)]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(PARTS[:3])),
        st.tuples(st.just("release"), st.sampled_from(PARTS[:3])),
        st.tuples(st.just("take_lease"), st.sampled_from(PARTS)),
        st.tuples(st.just("suspend"), st.none()),
        st.tuples(st.just("resume"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_leases_agree_with_a_model_of_holds(ops):
    """A lease is valid exactly while the hold it was taken under lasts (no release and
    no new acquire of that partition since) and nothing is suspended; a topic-less lease
    (timers) while any topic holds the journal partition."""
    own = Ownership()
    holds: dict[tuple[str, int], int] = {}  # model: partition -> hold number
    hold_no = 0
    leases: list[tuple[tuple[str, int], int, int | None]] = []  # (tp, lease, model hold)
    suspended = False
    for op, tp in ops:
        if op == "acquire":
            own.acquire(*tp)
            hold_no += 1
            holds[tp] = hold_no
        elif op == "release":
            assert own.release(*tp) == (tp in holds)
            holds.pop(tp, None)
        elif op == "take_lease":
            topic, partition = tp
            journal_held = any(p == partition for _, p in holds)
            held = holds.get(tp) if topic else (-1 if journal_held else None)
            leases.append((tp, own.lease(topic, partition), held))
        elif op == "suspend":
            own.suspend("test")
            suspended = True
        else:
            own.resume()
            suspended = False
        for (topic, partition), lease, held in leases:
            if topic:
                expected = held is not None and holds.get((topic, partition)) == held
            else:
                expected = held is not None and any(p == partition for _, p in holds)
            expected = expected and not suspended
            assert own.valid(topic, partition, lease) == expected, (op, tp, topic, partition)
        for partition in (0, 1):
            assert own.holds(partition) == (not suspended and any(p == partition for _, p in holds))
