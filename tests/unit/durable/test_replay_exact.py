"""Replay is exact (issue 10): values, digests, exceptions, reconcilers, call shapes.

Every test counts executions: a journaled call must run once however often the action
is replayed, and a replay must hand back what the first run saw, types included.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from agents_stream import CodeBlockViolation, DurableCallable, DurableCallError, JournalDecodeError
from agents_stream.durable import (
    ActionRef,
    CallStatus,
    ContextConfig,
    ResultTooLargeError,
    RunnerContext,
    UnsupportedValueError,
)
from agents_stream.durable.identity import legacy_args_digest
from agents_stream.durable.journal import CallEntry, ExceptionInfo
from agents_stream.durable.payload import JSON
from agents_stream.state import InMemoryActionStateStore

REF = ActionRef("user-1", 42, "Scoring.process#0", 0)
POOL = ThreadPoolExecutor(4)
CALL_ID = "app:user-1:42:Scoring.process#0:0"


def make_ctx(store, **config) -> RunnerContext:
    cfg = ContextConfig(app_id="app", worker_id="w1", codec=JSON, executor=POOL, **config)
    return RunnerContext(REF, store, cfg, {})


class Runs:
    """Counts calls per name; returns what ``results`` says."""

    def __init__(self, **results) -> None:
        self.results = results
        self.counts: dict[str, int] = {}

    def fn(self, name):
        def call(*args, **kwargs):
            self.counts[name] = self.counts.get(name, 0) + 1
            result = self.results[name]
            return result(*args, **kwargs) if callable(result) else result

        call.__durable_id__ = f"tests.{name}"  # type: ignore[attr-defined]
        return call


class Crash(BaseException):
    """Stands for the process dying mid-call: nothing after it is journaled."""


# -- 1. round trip is exact -------------------------------------------------------------
def test_int_keyed_result_replays_exactly_so_the_next_call_is_not_rerun():
    store = InMemoryActionStateStore()
    runs = Runs(load={1: 5, (2, "x"): Decimal("1.50")}, use=lambda d: sorted(map(str, d)))

    def action(ctx):
        loaded = ctx.execute(runs.fn("load"))
        return loaded, ctx.execute(runs.fn("use"), loaded)

    first = action(make_ctx(store))
    again = action(make_ctx(store))
    assert again == first and type(again[0]) is dict
    assert list(again[0]) == [1, (2, "x")] and type(again[0][(2, "x")]) is Decimal
    assert runs.counts == {"load": 1, "use": 1}


class Opaque:
    pass


def test_argument_outside_the_domain_is_refused_before_pending_and_before_running():
    store = InMemoryActionStateStore()
    runs = Runs(charge=1)
    with pytest.raises(UnsupportedValueError, match=r"Opaque at args\[0\]\[1\]"):
        make_ctx(store).execute(runs.fn("charge"), (1, Opaque()), reconciler=lambda: 1)
    assert store.log == [] and runs.counts == {}


def test_result_outside_the_domain_fails_the_call_once_and_replays_the_failure():
    store = InMemoryActionStateStore()
    runs = Runs(make=Opaque)
    with pytest.raises(UnsupportedValueError, match="Opaque at result"):
        make_ctx(store).execute(runs.fn("make"))
    [entry] = store.log
    assert entry.status is CallStatus.FAILED
    with pytest.raises(UnsupportedValueError, match="Opaque at result"):
        make_ctx(store).execute(runs.fn("make"))
    assert runs.counts == {"make": 1}


# -- 2. the args digest sees values -----------------------------------------------------
@pytest.mark.parametrize(
    "before, after",
    [
        (Decimal("10.00"), Decimal("20.00")),
        (datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC)),
        ({1: "a"}, {"1": "a"}),
        ((1, 2), [1, 2]),
    ],
)
def test_a_changed_argument_is_a_mismatch_never_a_stale_replay(before, after):
    store = InMemoryActionStateStore()
    runs = Runs(charge=lambda amount: repr(amount))
    assert make_ctx(store).execute(runs.fn("charge"), before) == repr(before)
    assert make_ctx(store).execute(runs.fn("charge"), after) == repr(after)
    assert runs.counts == {"charge": 2}


def test_slots_digested_before_the_upgrade_still_replay():
    store = InMemoryActionStateStore()
    legacy = legacy_args_digest((Decimal("10"),), {})
    store.append(
        [
            CallEntry(REF, 0, "tests.charge", legacy, CallStatus.SUCCEEDED, result=b'"ok"'),
        ],
        0,
    )
    runs = Runs(charge="again")
    assert make_ctx(store).execute(runs.fn("charge"), Decimal("10")) == "ok"
    assert runs.counts == {}


# -- 3. exceptions replay as equivalents ------------------------------------------------
class Declined(Exception):
    def __init__(self, code: str, amount: Decimal) -> None:
        super().__init__(code, amount)
        self.code, self.amount = code, amount


class Formatted(Exception):
    """Its args are not its constructor's: cannot be rebuilt."""

    def __init__(self, code: int) -> None:
        super().__init__(f"failed with {code}")


def replayed(exc: Exception) -> BaseException:
    store = InMemoryActionStateStore()
    runs = Runs(fail=lambda: (_ for _ in ()).throw(exc))
    with pytest.raises(type(exc)):
        make_ctx(store).execute(runs.fn("fail"))
    with pytest.raises(BaseException) as err:
        make_ctx(store).execute(runs.fn("fail"))
    assert runs.counts == {"fail": 1}
    return err.value


def test_custom_exception_with_constructor_args_replays_as_itself():
    err = replayed(Declined("card_declined", Decimal("9.99")))
    assert type(err) is Declined and err.amount == Decimal("9.99") and err.code == "card_declined"


class Payments:
    class Declined(Exception):
        pass


def test_nested_exception_class_replays_as_itself():
    err = replayed(Payments.Declined("nested", 1))
    assert type(err) is Payments.Declined and err.args == ("nested", 1)


def test_key_error_message_is_not_double_quoted():
    err = replayed(KeyError("x"))
    assert type(err) is KeyError and str(err) == "'x'" and err.args == ("x",)


def test_os_error_keeps_errno_and_filenames():
    err = replayed(FileNotFoundError(2, "No such file", "/tmp/in.csv"))
    assert type(err) is FileNotFoundError
    assert (err.errno, err.strerror, err.filename) == (2, "No such file", "/tmp/in.csv")


def test_exception_that_cannot_be_rebuilt_becomes_durable_call_error():
    err = replayed(Formatted(7))
    assert isinstance(err, DurableCallError)
    assert err.type_name.endswith("Formatted") and err.original_message == "failed with 7"


def test_entries_before_v5_rebuild_from_the_message():
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)
    digest = ctx._describe(Runs(f=1).fn("f"), (), {}, None, None).digest
    info = ExceptionInfo("builtins.ValueError", "bad 1", "tb")  # args None: pre-v5
    store.append([CallEntry(REF, 0, "tests.f", digest, CallStatus.FAILED, exception=info)], 0)
    with pytest.raises(ValueError, match="bad 1") as err:
        make_ctx(store).execute(Runs(f=1).fn("f"))
    assert err.value.args == ("bad 1",)


# -- 4. impossible journal states are fatal, named --------------------------------------
@pytest.mark.parametrize(
    "status, changes",
    [
        (CallStatus.FAILED, {}),
        (
            CallStatus.FAILED,
            {"exception": ExceptionInfo("builtins.ValueError", "x", "", b"\x1e\x01{")},
        ),
        (CallStatus.SUCCEEDED, {"exception": ExceptionInfo("builtins.ValueError", "x")}),
    ],
)
def test_impossible_slot_is_a_journal_decode_error_naming_the_slot(status, changes):
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)
    digest = ctx._describe(Runs(f=1).fn("f"), (), {}, None, None).digest
    store.append([CallEntry(REF, 0, "tests.f", digest, status, **changes)], 0)
    with pytest.raises(JournalDecodeError) as err:
        make_ctx(store).execute(Runs(f=1).fn("f"))
    assert (err.value.key, err.value.seq, err.value.action, err.value.index) == (
        "user-1",
        42,
        "Scoring.process#0",
        0,
    )


# -- 5. results over the journal's record limit -----------------------------------------
def test_oversized_result_fails_with_a_library_error_before_producing():
    store = InMemoryActionStateStore()
    runs = Runs(blob="x" * 5000)
    with pytest.raises(ResultTooLargeError, match=r"max\.message\.bytes") as err:
        make_ctx(store, max_entry_bytes=4096).execute(runs.fn("blob"))
    assert "store large payloads elsewhere" in str(err.value)
    [entry] = store.log
    assert entry.status is CallStatus.FAILED and entry.result is None
    with pytest.raises(ResultTooLargeError):
        make_ctx(store, max_entry_bytes=4096).execute(runs.fn("blob"))
    assert runs.counts == {"blob": 1}


def test_oversized_exception_is_still_journaled_within_the_limit():
    store = InMemoryActionStateStore()
    runs = Runs(fail=lambda: (_ for _ in ()).throw(ValueError("y" * 50_000)))
    with pytest.raises(ValueError):
        make_ctx(store, max_entry_bytes=8192).execute(runs.fn("fail"))
    [entry] = store.log
    info = entry.exception
    assert info.args is None and len(info.message) + len(info.traceback) < 8192


# -- 6. reconciler forms ----------------------------------------------------------------
class Ledger:
    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.charged = 0
        self.looked_up = 0

    def charge(self, call_id, amount):
        self.charged += 1
        self.charges[call_id] = amount
        return {"charged": amount}

    def lookup(self, call_id):
        self.looked_up += 1
        return {"charged": self.charges[call_id]}


def crash_after_pending(store, fn, *args, **options):
    """First run: PENDING is acked, then the process dies inside the function."""

    def dies(call_id, *a):
        fn(call_id, *a)
        raise Crash

    dies.__durable_id__ = "tests.charge"  # type: ignore[attr-defined]
    with pytest.raises(Crash):
        make_ctx(store).execute(dies, *args, **options)
    assert [e.status for e in store.log] == [CallStatus.PENDING]


def test_zero_argument_reconciler_runs_after_a_crash_instead_of_the_function():
    store, ledger = InMemoryActionStateStore(), Ledger()
    order_id = CALL_ID  # what a user keys the ledger by

    crash_after_pending(store, ledger.charge, 10, reconciler=lambda: ledger.lookup(order_id))
    assert ledger.charged == 1

    def charge(call_id, amount):
        return ledger.charge(call_id, amount)

    charge.__durable_id__ = "tests.charge"  # type: ignore[attr-defined]
    fresh = make_ctx(store)
    assert fresh.execute(charge, 10, reconciler=lambda: ledger.lookup(order_id)) == {"charged": 10}
    assert (ledger.charged, ledger.looked_up) == (1, 1)
    assert store.calls(REF)[0].status is CallStatus.SUCCEEDED


def test_durable_callable_zero_argument_reconciler_after_a_crash():
    store, ledger = InMemoryActionStateStore(), Ledger()

    class Charge(DurableCallable):
        id = "tests.charge"

        def call(self, call_id, amount):
            return ledger.charge(call_id, amount)

        def reconciler(self):
            return ledger.lookup(CALL_ID)

    crash_after_pending(store, ledger.charge, 7, reconciler=Charge().reconciler)
    result = asyncio.run(make_ctx(store).execute_async(Charge(), 7))
    assert result == {"charged": 7} and (ledger.charged, ledger.looked_up) == (1, 1)


def test_call_id_only_reconciler_gets_the_call_id():
    store, ledger = InMemoryActionStateStore(), Ledger()
    crash_after_pending(store, ledger.charge, 3, reconciler=ledger.lookup)
    fresh_charge = Runs(c=0).fn("charge")
    assert make_ctx(store).execute(fresh_charge, 3, reconciler=ledger.lookup) == {"charged": 3}
    assert ledger.looked_up == 1


def test_reconciler_of_another_shape_is_refused_before_pending():
    store = InMemoryActionStateStore()
    runs = Runs(charge=1)
    with pytest.raises(TypeError, match="must take no arguments or the call's own"):
        make_ctx(store).execute(runs.fn("charge"), 1, reconciler=lambda a, b, c: None)
    assert store.log == [] and runs.counts == {}


# -- 7. call_id and argument binding ----------------------------------------------------
def test_keyword_only_call_id_is_injected():
    store = InMemoryActionStateStore()
    seen = []

    def charge(amount, *, call_id):
        seen.append((amount, call_id))
        return amount

    assert make_ctx(store).execute(charge, 5) == 5
    assert asyncio.run(make_ctx(store).execute_async(charge, 5)) == 5  # replayed
    assert seen == [(5, CALL_ID)]


def test_arguments_that_do_not_bind_raise_and_are_not_journaled():
    store = InMemoryActionStateStore()
    runs = []

    def double(x):
        runs.append(x)
        return 2 * x

    with pytest.raises(TypeError, match="nothing was journaled"):
        make_ctx(store).execute(double, 1, 2)
    with pytest.raises(TypeError):
        asyncio.run(make_ctx(store).execute_async(double, y=1))
    assert store.log == [] and runs == []
    # a TypeError the function itself raises is its outcome, journaled as usual
    with pytest.raises(TypeError):
        make_ctx(store).execute(double, None)
    assert [e.status for e in store.log] == [CallStatus.FAILED]


# -- 8. out-of-order awaits and a late mismatch -----------------------------------------
@pytest.mark.parametrize("b_was_journaled", [False, True])
def test_late_mismatch_keeps_slots_already_acknowledged_in_this_run(b_was_journaled):
    store = InMemoryActionStateStore()
    runs = Runs(a=lambda x: f"a{x}", b="b")

    async def action(ctx, a_arg):
        a = ctx.execute_async(runs.fn("a"), a_arg)
        b = ctx.execute_async(runs.fn("b"))
        got_b = await b
        return await a, got_b

    if b_was_journaled:
        asyncio.run(action(make_ctx(store), "old"))
    else:
        make_ctx(store).execute(runs.fn("a"), "old")
    b_runs = runs.counts.get("b", 0)

    assert asyncio.run(action(make_ctx(store), "new")) == ("anew", "b")
    assert sorted(store.calls(REF)) == [0, 1]  # b's slot survived a's truncation
    assert runs.counts["b"] == 1  # run once, in whichever run first reached it

    ctx = make_ctx(store)
    assert asyncio.run(action(ctx, "new")) == ("anew", "b")
    assert ctx.replayed_calls == 2 and runs.counts["b"] == max(b_runs, 1)


# -- 9. the memory guard on threads and after BaseException -----------------------------
def test_memory_guard_holds_for_code_blocks_on_threads():
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)

    def touch():
        ctx.short_term_memory.get("x")

    async def in_executor():
        await ctx.execute_async(touch)

    with pytest.raises(CodeBlockViolation):
        asyncio.run(in_executor())

    errors = []

    def from_thread():
        try:
            ctx.execute(touch)
        except CodeBlockViolation as exc:
            errors.append(exc)

    thread = threading.Thread(target=from_thread)
    thread.start()
    thread.join()
    assert len(errors) == 1
    with pytest.raises(CodeBlockViolation):
        POOL.submit(ctx.execute, touch).result()


def test_memory_guard_is_released_when_a_code_block_raises_base_exception():
    one_thread = ThreadPoolExecutor(1)
    store = InMemoryActionStateStore()
    ctx = make_ctx(store)

    def dies():
        raise Crash

    with pytest.raises(Crash):
        one_thread.submit(ctx.execute, dies).result()
    # the same thread (its context outlives the call) runs the next action's body
    later = make_ctx(InMemoryActionStateStore())
    one_thread.submit(later.short_term_memory.set, "a", 1).result()
    with pytest.raises(Crash):
        ctx.execute(dies)
    ctx.short_term_memory.get("a")
    one_thread.shutdown()


def test_replayed_entry_is_unchanged_by_replay():
    store = InMemoryActionStateStore()
    runs = Runs(f=(1, {2: b"3"}))
    make_ctx(store).execute(runs.fn("f"))
    before = store.calls(REF)[0]
    make_ctx(store).execute(runs.fn("f"))
    assert store.calls(REF)[0] == before == replace(before)


def test_pickle_codec_stays_an_opt_in_for_results_only():
    from agents_stream import PickleCodec

    store = InMemoryActionStateStore()
    cfg = ContextConfig(app_id="app", worker_id="w1", codec=PickleCodec(), executor=POOL)
    runs = Runs(make=lambda: Declined("x", Decimal(1)), bad=lambda: lambda: 1)
    result = RunnerContext(REF, store, cfg, {}).execute(runs.fn("make"))
    assert type(result) is Declined
    with pytest.raises(UnsupportedValueError, match="args"):
        RunnerContext(REF, store, cfg, {}).execute(runs.fn("make"), Opaque())
    with pytest.raises(Exception, match="pickle payload codec cannot encode"):
        RunnerContext(REF, InMemoryActionStateStore(), cfg, {}).execute(runs.fn("bad"))
