"""Every branch of the slot state machine, against the in-memory store."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from agents_stream import (
    CodeBlockViolation,
    DurableCallable,
    DurableCallError,
    NonDeterminismError,
    RetryPolicy,
)
from agents_stream.durable import ActionRef, CallStatus, ContextConfig, RunnerContext
from agents_stream.durable.journal import CallEntry, ExceptionInfo, Truncation
from agents_stream.durable.payload import JSON
from agents_stream.state import InMemoryActionStateStore

REF = ActionRef("user-1", 42, "Scoring.process#0", 0)
POOL = ThreadPoolExecutor(4)


class Counter:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        return {"echo": list(args)}


def make_ctx(store, *, strict: bool = False) -> RunnerContext:
    cfg = ContextConfig(app_id="app", worker_id="w1", codec=JSON, strict=strict, executor=POOL)
    return RunnerContext(REF, store, cfg, {})


def double(x):
    return x * 2


def boom(x):
    raise ValueError(f"bad {x}")


class Payment(DurableCallable):
    id = "payments.charge"

    def __init__(self, ledger: dict) -> None:
        self.ledger = ledger
        self.charged = 0
        self.reconciled = 0

    def call(self, call_id, amount):
        self.charged += 1
        self.ledger[call_id] = amount
        return {"charged": amount}

    def reconciler(self, call_id, amount):
        self.reconciled += 1
        if call_id in self.ledger:
            return {"charged": self.ledger[call_id]}
        raise LookupError("no charge found")


def test_execute_journals_and_replays_result():
    store = InMemoryActionStateStore()
    assert make_ctx(store).execute(double, 21) == 42
    [entry] = store.entries()
    assert entry.status is CallStatus.SUCCEEDED and entry.index == 0
    assert entry.call_id == "app:user-1:42:Scoring.process#0:0"

    counter = Counter()
    counter.__qualname__ = "double"  # type: ignore[attr-defined]
    ctx = make_ctx(store)
    assert ctx.execute(double, 21) == 42
    assert ctx.replayed_calls == 1 and ctx.executed_calls == 0


def test_failed_call_is_reraised_with_same_type_without_running():
    store = InMemoryActionStateStore()
    with pytest.raises(ValueError, match="bad 1"):
        make_ctx(store).execute(boom, 1)
    runs = []

    def boom_again(x):  # same identity is what matters: reuse boom's id
        runs.append(x)

    boom_again.__durable_id__ = f"{__name__}.boom"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="bad 1"):
        make_ctx(store).execute(boom_again, 1)
    assert runs == []


def test_unknown_exception_type_becomes_durable_call_error():
    entry = CallEntry(
        REF,
        0,
        f"{__name__}.double",
        "",
        CallStatus.FAILED,
        exception=ExceptionInfo("not_loaded_module.Weird", "nope", "tb"),
    )
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)
    digest = ctx._describe(double, (1,), {}, None, None).digest
    store.append([CallEntry(**{**entry.__dict__, "args_digest": digest})], 0)
    with pytest.raises(DurableCallError) as err:
        make_ctx(store).execute(double, 1)
    assert err.value.type_name == "not_loaded_module.Weird"
    assert err.value.original_traceback == "tb"


def test_reconcilable_call_persists_pending_before_running():
    store = InMemoryActionStateStore()
    seen_status = []
    ledger: dict = {}
    pay = Payment(ledger)
    original = pay.call

    def spying_call(call_id, amount):
        seen_status.append([e.status for e in store.entries()])
        return original(call_id, amount)

    pay.call = spying_call  # type: ignore[method-assign]
    assert make_ctx(store).execute(pay, 10) == {"charged": 10}
    assert seen_status == [[CallStatus.PENDING]]
    assert [e.status for e in store.log] == [CallStatus.PENDING, CallStatus.SUCCEEDED]


def test_pending_slot_runs_reconciler_not_function():
    store = InMemoryActionStateStore()
    ledger = {"app:user-1:42:Scoring.process#0:0": 10}  # the charge went through, then crash
    pay = Payment(ledger)
    ctx = make_ctx(store)
    call = ctx._describe(pay, (10,), {}, None, None)
    store.append([ctx._entry(0, call, CallStatus.PENDING, 1)], 0)

    assert make_ctx(store).execute(pay, 10) == {"charged": 10}
    assert (pay.charged, pay.reconciled) == (0, 1)
    assert store.calls(REF)[0].status is CallStatus.SUCCEEDED


def test_pending_reconciler_exception_is_journaled_as_failed():
    store = InMemoryActionStateStore()
    pay = Payment({})
    ctx = make_ctx(store)
    store.append(
        [ctx._entry(0, ctx._describe(pay, (5,), {}, None, None), CallStatus.PENDING, 1)], 0
    )
    with pytest.raises(LookupError):
        make_ctx(store).execute(pay, 5)
    assert store.calls(REF)[0].status is CallStatus.FAILED
    assert pay.charged == 0


def test_pending_without_reconciler_re_executes():
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)
    store.append(
        [ctx._entry(0, ctx._describe(double, (3,), {}, None, None), CallStatus.PENDING, 1)], 0
    )
    assert make_ctx(store).execute(double, 3) == 6
    assert store.calls(REF)[0].status is CallStatus.SUCCEEDED


def test_keyword_reconciler():
    store = InMemoryActionStateStore()
    assert make_ctx(store).execute(double, 2, reconciler=lambda x: x) == 4
    assert [e.status for e in store.log] == [CallStatus.PENDING, CallStatus.SUCCEEDED]


def test_mismatch_truncates_later_slots_and_warns(caplog):
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)
    ctx.execute(double, 1)
    ctx.execute(double, 2)
    ctx.execute(double, 3)
    with caplog.at_level(logging.WARNING):
        ctx2 = make_ctx(store)
        assert ctx2.execute(double, 1) == 2  # replay
        assert ctx2.execute(double, 99) == 198  # diverged: re-executed
    assert ctx2.replayed_calls == 1 and ctx2.executed_calls == 1
    assert "call_index=1" in caplog.text and "user-1" in caplog.text
    assert sorted(store.calls(REF)) == [0, 1]  # slot 2 was dropped
    [trunc] = [e for e in store.entries() if isinstance(e, Truncation)]
    assert (trunc.index, trunc.dropped) == (1, 2)


def test_strict_mode_raises_typed_error():
    store = InMemoryActionStateStore()
    make_ctx(store).execute(double, 1)
    with pytest.raises(NonDeterminismError) as err:
        make_ctx(store, strict=True).execute(boom, 1)
    assert err.value.index == 0 and err.value.key == "user-1"


def test_retry_only_final_outcome_journaled():
    store = InMemoryActionStateStore()
    attempts = []

    def flaky(x):
        attempts.append(x)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return x

    policy = RetryPolicy(
        max_attempts=5, backoff="fixed", initial_delay=0.001, retry_on=(ConnectionError,)
    )
    assert make_ctx(store).execute(flaky, 7, retry=policy) == 7
    assert len(attempts) == 3
    [entry] = store.log
    assert entry.status is CallStatus.SUCCEEDED and entry.attempts == 3


def test_retry_gives_up_and_journals_failure():
    store = InMemoryActionStateStore()
    policy = RetryPolicy(max_attempts=2, initial_delay=0.001, retry_on=lambda e: True)
    with pytest.raises(ValueError):
        make_ctx(store).execute(boom, 1, retry=policy)
    [entry] = store.log
    assert entry.status is CallStatus.FAILED and entry.attempts == 2


def test_call_id_injection_is_stable():
    store = InMemoryActionStateStore()
    ids = []

    def charge(call_id, amount):
        ids.append(call_id)
        return call_id

    first = make_ctx(store).execute(charge, 5)
    assert make_ctx(store).execute(charge, 5) == first
    assert ids == ["app:user-1:42:Scoring.process#0:0"]


def test_memory_and_events_forbidden_inside_code_block():
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)
    with pytest.raises(CodeBlockViolation, match=r"short_term_memory\.set"):
        ctx.execute(lambda: ctx.short_term_memory.set("a", 1))
    with pytest.raises(CodeBlockViolation, match="send_event"):
        ctx.execute(lambda: ctx.send_event(None))  # type: ignore[arg-type]
    ctx.short_term_memory.set("a", 1)  # fine outside
    assert ctx.short_term_memory.get("a") == 1


def test_memory_forbidden_inside_async_code_blocks():
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)

    async def touch():
        ctx.short_term_memory.get("x")

    def touch_sync():
        ctx.short_term_memory.get("x")

    async def main():
        with pytest.raises(CodeBlockViolation):
            await ctx.execute_async(touch)
        with pytest.raises(CodeBlockViolation):
            await ctx.execute_async(touch_sync)
        ctx.short_term_memory.get("x")

    asyncio.run(main())


def test_an_async_code_block_cut_short_leaves_the_action_outside_it():
    """The flag lives in the action's own context while the block is awaited in place:
    a timeout (cancellation) or an error inside must not leave it set."""
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)

    async def hang():
        await asyncio.sleep(10)

    async def fail():
        raise ValueError("no")

    async def main():
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await ctx.execute_async(hang)
        ctx.short_term_memory.set("after-timeout", 1)
        with pytest.raises(ValueError):
            await ctx.execute_async(fail)
        ctx.short_term_memory.set("after-error", 1)

    asyncio.run(main())


def test_gather_replays_deterministically_despite_completion_order():
    store = InMemoryActionStateStore()
    runs = []
    delays = {}

    async def slow(name):
        runs.append(name)
        await asyncio.sleep(delays[name])
        return name

    async def action(ctx, delay_a_b):
        delays.update(zip("ab", delay_a_b, strict=True))
        return await asyncio.gather(
            ctx.execute_async(slow, "a"),
            ctx.execute_async(slow, "b"),
            ctx.execute_async(double, 5),
        )

    assert asyncio.run(action(make_ctx(store), (0.03, 0.0))) == ["a", "b", 10]
    slots = store.calls(REF)
    assert [slots[i].status for i in range(3)] == [CallStatus.SUCCEEDED] * 3
    ctx = make_ctx(store)
    # different completion order on replay: the slots are still matched by start order
    assert asyncio.run(action(ctx, (0.0, 0.03))) == ["a", "b", 10]
    assert ctx.replayed_calls == 3 and runs == ["a", "b"]


def test_mixed_plain_and_reconcilable_calls_replay():
    store = InMemoryActionStateStore()
    pay = Payment({})

    async def action(ctx):
        a = await ctx.execute_async(double, 1)
        b = ctx.execute(pay, 3)
        c = await ctx.execute_async(double, 2)
        return a, b, c

    assert asyncio.run(action(make_ctx(store))) == (2, {"charged": 3}, 4)
    ctx = make_ctx(store)
    assert asyncio.run(action(ctx)) == (2, {"charged": 3}, 4)
    assert pay.charged == 1 and ctx.replayed_calls == 3


def test_async_reconcilable_pending_runs_reconciler():
    store = InMemoryActionStateStore()
    charged = []

    async def charge(call_id, amount):
        charged.append(amount)
        return "charged"

    async def check(call_id, amount):
        return "reconciled"

    ctx = make_ctx(store)
    store.append(
        [ctx._entry(0, ctx._describe(charge, (1,), {}, None, None), CallStatus.PENDING, 1)], 0
    )
    result = asyncio.run(make_ctx(store).execute_async(charge, 1, reconciler=check))
    assert result == "reconciled" and charged == []


def test_non_json_result_is_a_clear_error():
    from agents_stream.durable import PayloadError

    with pytest.raises(PayloadError, match="PickleCodec"):
        make_ctx(InMemoryActionStateStore()).execute(lambda: object())


def test_corrupt_result_payload_names_the_slot():
    from agents_stream import JournalDecodeError

    store = InMemoryActionStateStore()
    ctx = make_ctx(store)
    call = ctx._describe(double, (1,), {}, None, None)
    store.append([ctx._entry(0, call, CallStatus.SUCCEEDED, 1, result=b"\xff{")], 0)
    with pytest.raises(JournalDecodeError) as err:
        make_ctx(store).execute(double, 1)
    assert (err.value.key, err.value.seq, err.value.action, err.value.index) == (
        "user-1",
        42,
        "Scoring.process#0",
        0,
    )


def test_async_results_serve_due_reports_every_sixteen_appends(monkeypatch):
    """Async actions are tasks of their own, and one loop round resumes hundreds of them
    under load: their results' appends serve the delivery reports that are due now and
    then (``ContextConfig.acks.serve_due``), as a sync action's batch does, so that acks
    do not wait for the round to end."""
    served: list[int] = []

    class Serving:
        def serve_due(self) -> None:
            served.append(1)

        def wait(self, fut, timeout=None):
            return fut.result(timeout)

    cfg = ContextConfig(app_id="app", worker_id="w1", codec=JSON, executor=POOL, acks=Serving())

    async def action(ctx):
        return [await ctx.execute_async(double, n) for n in range(48)]

    ctx = RunnerContext(REF, InMemoryActionStateStore(), cfg, {})
    assert asyncio.run(action(ctx)) == [n * 2 for n in range(48)]
    assert len(served) == 3  # 48 results, one serve per 16 wherever the count stands
