"""Async actions are stepped in carriers (``run_coroutine_bridged``): a sync
``ctx.execute`` in their body runs inline and suspends for its journal ack instead of
blocking the event loop, and everything else behaves as under a plain task.

Before, the public contract's own example (an async action calling ``ctx.execute`` for a
quick computation) held the loop for every such call's ack: one record at a time.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from concurrent.futures import Future

import pytest

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable.bridge import run_coroutine_bridged
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.lane import run_records
from agents_stream.durable.payload import JSON
from agents_stream.durable.pool import CodeBlockPool
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.state.memory import InMemoryActionStateStore

RECORDS = 200
ran_on: set[str] = set()


def score(n: int) -> int:
    ran_on.add(threading.current_thread().name)
    return n * 10


class Scoring(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        await asyncio.sleep(0)
        total = ctx.execute(score, event.input)  # sync, from the async body
        ctx.short_term_memory.set("total", total)
        ctx.send_event(OutputEvent(output=total))


class HeldAcks(InMemoryActionStateStore):
    """Acks are held until every record waits for one (or a deadline passes: a loop
    blocked by a wait would never get there), then released by another thread."""

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.held: list[Future[None]] = []
        self.peak = 0
        self.released = threading.Event()
        threading.Thread(target=self._release_later, daemon=True).start()

    def append(self, entries, partition):  # type: ignore[no-untyped-def]
        super().append(entries, partition)
        fut: Future[None] = Future()
        if self.released.is_set():
            fut.set_result(None)
            return fut
        self.held.append(fut)
        self.peak = max(self.peak, sum(not f.done() for f in self.held))
        return fut

    def _release_later(self) -> None:
        deadline = time.monotonic() + 3
        while self.peak < self.expected and time.monotonic() < deadline:
            time.sleep(0.01)
        self.released.set()
        for fut in list(self.held):
            fut.set_result(None)


def test_sync_calls_of_async_actions_wait_for_acks_without_blocking_the_loop() -> None:
    store = HeldAcks(RECORDS)
    pool = CodeBlockPool(2, thread_name_prefix="pool")
    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, executor=pool)
    runner = ActionRunner(Scoring, store, config)

    async def main() -> list[int]:
        outcomes = await asyncio.gather(
            *(runner.run(RecordInput(f"k{n}", n, n)) for n in range(RECORDS))
        )
        return [o.outputs[0] for o in outcomes]

    ran_on.clear()
    try:
        assert asyncio.run(main()) == [n * 10 for n in range(RECORDS)]
    finally:
        pool.shutdown()
    assert store.peak == RECORDS  # every record's call waited at once: the loop ran on
    assert ran_on == {threading.main_thread().name}  # inline, as documented: no pool hop


def test_batch_path_steps_async_actions_too() -> None:
    store = HeldAcks(RECORDS)
    pool = CodeBlockPool(2)
    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, executor=pool)
    runner = ActionRunner(Scoring, store, config)
    outcomes: dict[int, object] = {}

    async def main() -> None:
        records = [RecordInput(f"k{n}", n, n) for n in range(RECORDS)]
        await run_records(runner, records, lambda i, outcome: outcomes.__setitem__(i, outcome))

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    assert store.peak == RECORDS
    assert sorted(o.outputs[0] for o in outcomes.values()) == [n * 10 for n in range(RECORDS)]


def total_of(ctx: RunnerContext, n: int) -> int:
    return ctx.execute(score, n)  # the action's own code does not name ctx.execute


class ScoringViaHelper(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=total_of(ctx, event.input)))


@pytest.mark.parametrize("batch", [False, True], ids=["per-record", "batch"])
def test_a_helper_calling_execute_blocks_once_then_the_action_runs_in_a_carrier(
    batch: bool,
) -> None:
    """Static detection misses a helper function; its first call (which blocked the loop
    for its ack) teaches the worker, and every later record of the action suspends."""
    from agents_stream.agent import _LEARNED_SYNC

    _LEARNED_SYNC.discard("ScoringViaHelper.process")
    pool = CodeBlockPool(2)
    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, executor=pool)
    first = ActionRunner(ScoringViaHelper, InMemoryActionStateStore(), config)
    store = HeldAcks(RECORDS)
    runner = ActionRunner(ScoringViaHelper, store, config)
    outcomes: dict[int, object] = {}

    async def main() -> None:
        (spec,) = ScoringViaHelper.actions()
        assert not spec.in_carrier
        assert (await first.run(RecordInput("k", 0, 0))).outputs == [0]  # blocked, learned
        assert spec.in_carrier
        records = [RecordInput(f"k{n}", n, n) for n in range(RECORDS)]
        if batch:
            await run_records(runner, records, lambda i, outcome: outcomes.__setitem__(i, outcome))
        else:
            done = await asyncio.gather(*(runner.run(r) for r in records))
            outcomes.update(enumerate(done))

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
        _LEARNED_SYNC.discard("ScoringViaHelper.process")
    assert store.peak == RECORDS  # every later record waited for its ack at once
    assert sorted(o.outputs[0] for o in outcomes.values()) == [n * 10 for n in range(RECORDS)]


# -- the stepping itself behaves as a task ----------------------------------------------
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_results_exceptions_context_and_current_task() -> None:
    async def body(seen: list[object]) -> str:
        seen.append(asyncio.current_task())
        VAR.set("inside")
        await asyncio.sleep(0)  # a bare yield
        await asyncio.sleep(0.001)  # a future
        seen.append(VAR.get())  # kept across steps
        try:
            await asyncio.get_running_loop().run_in_executor(None, lambda: 1 / 0)
        except ZeroDivisionError:
            seen.append("caught")
        return "done"

    async def main() -> tuple[str, list[object], object, str]:
        seen: list[object] = []
        task = asyncio.current_task()
        result = await run_coroutine_bridged(body(seen))
        return result, seen, task, VAR.get()

    result, seen, task, outside = asyncio.run(main())
    assert result == "done"
    assert seen == [task, "inside", "caught"]
    assert outside == "unset"  # the body's context is a copy, as a task's would be

    async def failing() -> None:
        await asyncio.sleep(0)
        raise KeyError("x")

    with pytest.raises(KeyError):
        asyncio.run(run_coroutine_bridged(failing()))


def test_cancellation_and_timeouts_reach_the_body() -> None:
    cleaned: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append("finally")

    async def cancel_it() -> bool:
        task = asyncio.ensure_future(run_coroutine_bridged(slow()))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return task.cancelled()
        return False

    assert asyncio.run(cancel_it())
    assert cleaned == ["finally"]

    async def timed() -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(10)
        except TimeoutError:
            return "timed out"
        return "not"

    assert asyncio.run(run_coroutine_bridged(timed())) == "timed out"

    async def swallow() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "swallowed"
        return "not"

    async def cancel_swallowed() -> str:
        task = asyncio.ensure_future(run_coroutine_bridged(swallow()))
        await asyncio.sleep(0.01)
        task.cancel()
        return await task

    assert asyncio.run(cancel_swallowed()) == "swallowed"
