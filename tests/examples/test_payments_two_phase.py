"""examples/payments_two_phase.py with the test kit: holds captured once the order is
committed, released when it is refused, replayed (not authorised again) after a crash."""

from __future__ import annotations

import pytest

from examples import payments_two_phase as pay


@pytest.fixture(autouse=True)
def provider(tmp_path, monkeypatch):
    monkeypatch.setattr(pay.PROVIDER, "path", str(tmp_path / "holds.sqlite"))
    monkeypatch.setattr(pay.PROVIDER, "_db", None)
    yield pay.PROVIDER
    pay.PROVIDER._db = None


def order(n: int, amount: float, customer: str = "c-ada") -> dict:
    return {"order": f"o-{n}", "customer": customer, "amount": amount}


def test_a_hold_is_captured_once_the_order_completes(provider):
    with pay.app.test_context() as ctx:
        run = ctx.send(order(1, 40.0), key="c-ada")
    [receipt] = run.outputs
    assert [c.phase for c in run.calls] == ["COMMITTED"]
    assert provider.states() == {receipt["hold"]: "CAPTURED"}


def test_an_order_over_the_limit_is_refused_and_its_hold_released(provider):
    with pay.app.test_context() as ctx:
        ctx.send(order(1, 60.0), key="c-ada")
        refused = ctx.send(order(2, 60.0), key="c-ada")
    assert isinstance(refused.error, pay.LimitExceeded)  # a worker dead-letters it
    assert sorted(provider.states().values()) == ["CAPTURED", "RELEASED"]


def test_held_until_settled_and_replayed_after_a_crash(provider):
    with pay.app.test_context(settle=False) as ctx:
        crashed = ctx.send(order(1, 10.0), key="c-bob", crash_after_calls=1)
        assert list(provider.states().values()) == ["AUTHORIZED"]
        again = ctx.redeliver(crashed)  # as a restarted worker: the hold is replayed
        assert (again.replayed, again.executed) == (1, 0)
        assert [c.phase for c in ctx.two_phase()] == ["PREPARED"]
        ctx.settle()
    assert list(provider.states().values()) == ["CAPTURED"]
