"""``ctx.execute`` in an action's body suspends for its journal ack (the action runs in a
carrier when its code names ``ctx.execute``, ``durable/bridge.py``); in a helper function
or a task the action created it cannot suspend and blocks the event loop, so the worker
says so, once per action and function, naming ``execute_async``, and runs the action's
later records in a carrier."""

from __future__ import annotations

import asyncio

import pytest

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable import context as context_module
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.payload import JSON
from agents_stream.durable.pool import CodeBlockPool
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.state.memory import InMemoryActionStateStore


def lookup(n: int) -> int:
    return n + 1


class AsyncBlocking(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        async def in_a_task() -> int:
            return ctx.execute(lookup, event.input)

        (result,) = await asyncio.gather(in_a_task())
        ctx.send_event(OutputEvent(output=result))


def helper(ctx: RunnerContext, n: int) -> int:
    return ctx.execute(lookup, n)


class AsyncViaHelper(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=helper(ctx, event.input)))


class AsyncInline(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=ctx.execute(lookup, event.input)))


class AsyncAwaiting(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=await ctx.execute_async(lookup, event.input)))


class SyncBridged(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=ctx.execute(lookup, event.input)))


class SyncViaHelper(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=helper(ctx, event.input)))


class SyncPlain(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=event.input + 1))


def _run(agent: type[Agent], records: int) -> list[int]:
    pool = CodeBlockPool(4)
    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, executor=pool)
    runner = ActionRunner(agent, InMemoryActionStateStore(), config)

    async def main() -> list[int]:
        outcomes = [await runner.run(RecordInput(f"k{n}", n, n)) for n in range(records)]
        return [o.outputs[0] for o in outcomes]

    try:
        return asyncio.run(main())
    finally:
        pool.shutdown()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    context_module._warned_blocking.clear()


@pytest.mark.parametrize("agent", [AsyncBlocking, AsyncViaHelper, SyncViaHelper])
def test_execute_where_it_cannot_suspend_is_warned_about_once(
    agent: type[Agent], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="agents_stream.durable"):
        assert _run(agent, 3) == [1, 2, 3]  # it still works, journaled
    warnings = [r.getMessage() for r in caplog.records if "blocked the event" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"{agent.__name__}.process" in warnings[0]
    assert "lookup" in warnings[0] and "execute_async" in warnings[0]


@pytest.mark.parametrize("agent", [AsyncInline, AsyncAwaiting, SyncBridged, SyncPlain])
def test_calls_that_do_not_block_the_loop_are_not_warned_about(
    agent: type[Agent], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="agents_stream.durable"):
        assert _run(agent, 3) == [1, 2, 3]
    assert not [r for r in caplog.records if "blocked the event" in r.getMessage()]


def test_which_actions_run_in_a_carrier() -> None:
    """Those whose code (nested functions included) names the sync call, sync or async;
    not those that only await ``execute_async`` or call no code block (a sync action
    without a carrier saves two greenlet switches per record)."""

    def flags(agent: type[Agent]) -> bool:
        (spec,) = agent.actions()
        return spec.calls_sync

    assert flags(AsyncInline) and flags(AsyncBlocking) and flags(SyncBridged)
    assert not flags(AsyncAwaiting) and not flags(AsyncViaHelper)
    assert not flags(SyncViaHelper) and not flags(SyncPlain)


def test_a_sync_action_calling_through_a_helper_is_learned() -> None:
    """Its first record blocks the loop for the call (it had no carrier); its later
    records run in one."""
    (spec,) = SyncViaHelper.actions()
    assert _run(SyncViaHelper, 2) == [1, 2]
    assert spec.in_carrier
    (plain,) = SyncPlain.actions()
    assert _run(SyncPlain, 2) == [1, 2] and not plain.in_carrier
