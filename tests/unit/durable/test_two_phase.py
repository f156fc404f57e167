"""Two-phase calls (TwoPhaseCommitCallable) in the test kit: prepare journaled and
replayed, commit once the record is committed, abort when it will never complete, and
the phases of a slot (PREPARED -> COMMITTED | ABORTED) against a model through crashes,
revokes and failing commits (hypothesis)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents_stream import TwoPhaseCommitCallable, UnsupportedValueError
from agents_stream.durable.journal import TwoPhase, TwoPhaseCall
from tests.apps import two_phase_kit_app as kit_app


@pytest.fixture(autouse=True)
def _clean():
    kit_app.LEDGER.clear()
    kit_app.STATE.update(commit_failures=0, cents_offset=0, prepare_fails=0, unjournalable=False)
    yield


def _ends(hold: str) -> list[str]:
    return [what for what, h in kit_app.LEDGER if h == hold and what != "hold"]


def test_prepared_then_committed_once_the_record_completes():
    with kit_app.app.test_context() as ctx:
        run = ctx.send({"order": "o1", "cents": 5}, key="k1")
    [hold] = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert run.outputs == [{"hold": hold}]
    assert hold == "kit-2pc:orders:k1:0:Pay.pay#0:0"  # the slot's call id
    two_phase = [c for c in run.calls if c.phase is not None]
    assert [(c.status, c.phase) for c in two_phase] == [("SUCCEEDED", "COMMITTED")]
    assert [c.phase for c in run.calls] == ["COMMITTED", None]  # the plain call: none
    assert _ends(hold) == ["capture"]


def test_an_action_that_raises_after_its_prepare_releases_the_hold():
    with kit_app.app.test_context() as ctx:
        run = ctx.send({"order": "o2", "cents": 5, "fail": True}, key="k2")
        assert isinstance(run.error, RuntimeError)
        assert [c.phase for c in ctx.two_phase()] == ["ABORTED"]
    [hold] = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert _ends(hold) == ["release"]


def test_a_crash_after_the_prepare_replays_it_then_commits_once():
    with kit_app.app.test_context() as ctx:
        crashed = ctx.send({"order": "o3", "cents": 5}, key="k3", crash_after_calls=1)
        assert crashed.crashed and [c.phase for c in ctx.two_phase()] == ["PREPARED"]
        again = ctx.redeliver(crashed)
    assert (again.replayed, again.executed) == (1, 1)  # the hold replayed, upper() run
    holds = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert len(holds) == 1 and _ends(holds[0]) == ["capture"]


def test_a_commit_that_raises_stays_prepared_and_is_retried():
    kit_app.STATE["commit_failures"] = 2
    with kit_app.app.test_context(settle=False) as ctx:
        ctx.send({"order": "o4", "cents": 5}, key="k4")
        assert [c.phase for c in ctx.two_phase()] == ["PREPARED"]
        [first] = ctx.settle()
        assert (first.phase, first.attempts) == ("PREPARED", 1)
        assert "ConnectionError: psp unavailable" in first.last_error
        [second] = ctx.settle()
        assert (second.phase, second.attempts) == ("PREPARED", 2)
        [third] = ctx.settle()
        assert (third.phase, third.attempts) == ("COMMITTED", 3)  # never turned into an abort
    [hold] = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert _ends(hold) == ["capture"]


def test_a_divergent_replay_aborts_the_preparation_and_prepares_afresh():
    with kit_app.app.test_context() as ctx:
        crashed = ctx.send({"order": "o5", "cents": 5}, key="k5", crash_after_calls=1)
        kit_app.STATE["cents_offset"] = 1  # the redelivery makes a different call
        again = ctx.redeliver(crashed)
    first, second = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert first == "kit-2pc:orders:k5:0:Pay.pay#0:0"
    assert second == first + "~1"  # prepared afresh: a round of its own
    assert _ends(first) == ["release"] and _ends(second) == ["capture"]
    assert again.outputs == [{"hold": second}]


def test_a_failed_record_run_again_prepares_afresh():
    """As a dead letter's replay does: its aborted preparation is not reused."""
    with kit_app.app.test_context() as ctx:
        failed = ctx.send({"order": "o6", "cents": 5, "fail": True}, key="k6")
        failed.value = {"order": "o6", "cents": 5}
        again = ctx.redeliver(failed)
    first, second = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert second == first + "~1"
    assert _ends(first) == ["release"] and _ends(second) == ["capture"]
    assert again.outputs == [{"hold": second}]


def test_gathered_async_preparations_replay_into_their_slots():
    with kit_app.async_app.test_context() as ctx:
        crashed = ctx.send({"order": "o7"}, key="k7", crash_after_calls=2)
        again = ctx.redeliver(crashed)
    holds = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert len(holds) == 2 and again.replayed == 2
    assert sorted(again.outputs[0]["holds"]) == sorted(holds)
    assert all(_ends(h) == ["capture"] for h in holds)


class _NotADataclass(TwoPhaseCommitCallable[int]):
    def prepare(self) -> int:
        return 1

    def commit(self, prepared: int) -> None: ...

    def abort(self, prepared: int) -> None: ...


@dataclass
class _NoAbort(TwoPhaseCommitCallable[int]):
    n: int

    def prepare(self) -> int:
        return 1

    def commit(self, prepared: int) -> None: ...


def test_refused_when_the_call_is_made(tmp_path):
    from agents_stream.durable.context import ContextConfig, RunnerContext
    from agents_stream.durable.journal import ActionRef
    from agents_stream.durable.payload import JsonCodec
    from agents_stream.durable.twophase import Settler
    from agents_stream.state.memory import InMemoryActionStateStore

    store = InMemoryActionStateStore()
    settler = Settler(store, JsonCodec(), app_id="a", worker_id="w", through=lambda t, p: None)
    config = ContextConfig(app_id="a", worker_id="w", codec=JsonCodec(), two_phase=settler)
    ctx = RunnerContext(ActionRef("k", 0, "A.a#0", 0, "t"), store, config, {})
    with pytest.raises(UnsupportedValueError):  # its fields are journaled: a dataclass
        ctx.execute(_NotADataclass())
    with pytest.raises(TypeError, match="does not implement abort"):
        ctx.execute(_NoAbort(1))
    with pytest.raises(TypeError, match="no reconciler"):
        ctx.execute(kit_app.Hold("o", 1), reconciler=lambda: None)
    bare = ContextConfig(app_id="a", worker_id="w", codec=JsonCodec())  # e.g. a backfill
    with pytest.raises(TypeError, match="does not settle two-phase calls"):
        RunnerContext(ActionRef("k", 0, "A.a#0", 0, "t"), store, bare, {}).execute(
            kit_app.Hold("o", 1)
        )
    timer = RunnerContext(ActionRef("k", -5, "A.a#e0", 0, "t"), store, config, {})
    with pytest.raises(TypeError, match="timer actions"):
        timer.execute(kit_app.Hold("o", 1))
    assert store.entries() == []  # nothing journaled, nothing run
    assert kit_app.LEDGER == []
    settler.close()


# -- the phases of a slot against a model --------------------------------------------------
# Operations on orders o0..o3 (o3 fails after its hold): deliver (whole, or crashed after
# the prepare, or before it), deliver again what crashed, settle (some commits raising),
# revoke the partition, take it again (its assignment sweep). After every step: no hold both captured and released, none
# captured before its record completed, none of the failing order captured. At the end
# (everything delivered, the partition taken again, commits succeeding): every hold ended
# exactly once; an order's last round captured iff it completed, earlier rounds released.

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 3), st.sampled_from([None, 0, 1])),
        st.tuples(st.just("settle"), st.integers(0, 2), st.none()),
        st.tuples(st.just("revoke"), st.none(), st.none()),
        st.tuples(st.just("assign"), st.none(), st.none()),
    ),
    min_size=3,
    max_size=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
# Crashed after its prepare while a later record completes and settles: not committed.
@example([("send", 0, 1), ("send", 1, None), ("settle", 0, None), ("send", 0, None)])
@example([("send", 3, 1), ("send", 2, None), ("settle", 1, None), ("revoke", None, None)])
@example([("send", 1, 1), ("revoke", None, None), ("send", 2, 0), ("settle", 2, None)])
def test_phases_against_a_model(ops):
    kit_app.LEDGER.clear()
    kit_app.STATE.update(commit_failures=0, cents_offset=0)
    completed: set[str] = set()  # orders whose record completed (model)
    pending: dict[str, object] = {}  # crashed deliveries, to deliver again
    sent: set[str] = set()
    with kit_app.app.test_context(settle=False) as ctx:

        def deliver(order: str, crash: int | None) -> None:
            n = int(order[1:])
            run = pending.pop(order, None)
            if run is not None:
                run = ctx.redeliver(run, crash_after_calls=crash)
            elif order not in sent:
                sent.add(order)
                value = {"order": order, "cents": 1, "fail": n == 3}
                run = ctx.send(value, key=order, crash_after_calls=crash)
            else:
                return  # delivered already: a worker would skip it
            if run.crashed:
                pending[order] = run
            elif run.error is None:
                completed.add(order)

        def reassign() -> None:
            # Taken again (here, or by the next owner): its sweep settles what is due,
            # aborting preparations of records below the marker that never completed.
            if ctx.ownership.lease("orders", 0) == 0:
                ctx.ownership.acquire("orders", 0)
            ctx.settler.assigned("orders", 0)
            ctx.settler.idle(30)

        def check() -> None:
            ends: dict[str, list[str]] = {}
            for what, hold in kit_app.LEDGER:
                if what != "hold":
                    ends.setdefault(hold, []).append(what)
            for hold, seen in ends.items():
                order = hold.split(":")[2]
                assert len(set(seen)) == 1, (hold, seen)  # never both
                if seen[0] == "capture":
                    assert order in completed and order != "o3", (hold, completed)

        for op, arg, crash in ops:
            if op == "send":
                deliver(f"o{arg}", crash)
            elif op == "settle":
                kit_app.STATE["commit_failures"] = arg
                ctx.settle()
            elif op == "revoke":
                ctx.ownership.release("orders", 0)
            else:
                reassign()
            check()
        kit_app.STATE["commit_failures"] = 0
        for order in sorted(pending):
            deliver(order, None)
        for n in range(4):
            deliver(f"o{n}", None)
        reassign()
        for _ in range(3):
            ctx.settle()
        check()
        assert all(c.phase in ("COMMITTED", "ABORTED") for c in ctx.two_phase())
    rounds: dict[str, list[str]] = {}
    for what, hold in kit_app.LEDGER:
        if what == "hold" and hold not in rounds.get(hold.split(":")[2], []):
            rounds.setdefault(hold.split(":")[2], []).append(hold)
    for order, holds in rounds.items():
        *earlier, last = holds  # prepared afresh after an abort: a round each
        want = "capture" if order in completed and order != "o3" else "release"
        assert set(_ends(last)) == {want}, (order, kit_app.LEDGER)
        for hold in earlier:
            assert set(_ends(hold)) == {"release"}, (order, kit_app.LEDGER)


def test_obligation_round_trips_through_the_store():
    from agents_stream.durable.journal import ActionRef
    from agents_stream.state.memory import InMemoryActionStateStore

    ref = ActionRef("k", 3, "A.a#0", 1, "t")
    x = TwoPhaseCall(ref, 0, "f", "d", TwoPhase.PREPARED, b"")
    store = InMemoryActionStateStore([x])
    assert store.obligation(ref, 0) == x and store.obligations(1) == [x]
    store.prune("k", 3, 1, "t")  # an obligation holds its record back from pruning
    assert store.obligations(1) == [x]
    store.prune_settled([(3, "k")], 1, "t")
    assert store.obligations(1) == []


def test_a_prepare_that_raised_after_an_abort_replays_its_failure():
    """A failed record run again prepares afresh; if that prepare raises, its FAILED slot
    is what the next run replays (not a third preparation)."""
    with kit_app.app.test_context() as ctx:
        failed = ctx.send({"order": "o8", "cents": 5, "fail": True}, key="k8")
        kit_app.STATE["prepare_fails"] = 1
        again = ctx.redeliver(failed)
        assert isinstance(again.error, ConnectionError)
        third = ctx.redeliver(failed)
        assert isinstance(third.error, ConnectionError)  # replayed: not prepared a third time
    holds = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert len(holds) == 1 and _ends(holds[0]) == ["release"]


def test_a_prepared_result_that_cannot_be_journaled_is_aborted_at_once():
    kit_app.STATE["unjournalable"] = True
    with kit_app.app.test_context() as ctx:
        run = ctx.send({"order": "o9", "cents": 5}, key="k9")
        ctx.settler.idle(10)
        time.sleep(0.2)  # the abort runs on the settler's pool
    assert isinstance(run.error, UnsupportedValueError)  # journaled as the call's failure
    [hold] = [h for what, h in kit_app.LEDGER if what == "hold"]
    assert _ends(hold) == ["release"]


def test_sweeps_read_only_open_obligations_after_the_first():
    """A journal that is not pruned keeps every settled obligation: a sweep reads the
    partition's obligations whole once, then only the open ones, point by point."""
    from agents_stream.durable.journal import ActionRef
    from agents_stream.durable.payload import JsonCodec
    from agents_stream.durable.twophase import Settler
    from agents_stream.state.memory import InMemoryActionStateStore

    class Counting(InMemoryActionStateStore):
        scans = 0

        def obligations(self, partition):
            Counting.scans += 1
            return super().obligations(partition)

    ref = ActionRef("k", 3, "A.a#0", 1, "t")
    settled = [TwoPhaseCall(ref, i, "f", "d", TwoPhase.COMMITTED, b"") for i in range(50)]
    store = Counting([*settled, TwoPhaseCall(ref, 50, "f", "d", TwoPhase.PREPARED, b"")])
    settler = Settler(store, JsonCodec(), app_id="a", worker_id="w", through=lambda t, p: None)
    try:
        assert settler.waiting == 1
        for _ in range(5):
            settler.sweep()
        assert settler.waiting == 1 and Counting.scans == 1
    finally:
        settler.close()
