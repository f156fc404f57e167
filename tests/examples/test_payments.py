"""examples/payments.py with the test kit (``app.test_context()``): no broker, the real
runners and codecs, the provider's SQLite ledger in a temp dir. What a user's own agent
tests look like."""

from __future__ import annotations

import sqlite3

import pytest

from examples import payments
from examples.payments import app


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setattr(payments.PROVIDER, "path", str(tmp_path / "ledger.sqlite"))
    monkeypatch.setattr(payments.PROVIDER, "_db", None)
    monkeypatch.setattr(payments.random, "random", lambda: 0.5)  # no provider timeouts
    yield tmp_path / "ledger.sqlite"
    payments.PROVIDER._db = None


def charges(path) -> list[tuple[str, float]]:
    if not path.exists():  # the provider makes its ledger on the first charge
        return []
    with sqlite3.connect(path) as db:
        return db.execute("SELECT customer, amount FROM charges ORDER BY id").fetchall()


def order(n: int, customer: str = "c-ada", amount: float = 10.0) -> dict:
    return {"order": f"o-{n}", "customer": customer, "amount": amount}


def test_orders_are_charged_and_totalled_per_customer(ledger):
    with app.test_context() as ctx:
        first = ctx.send(order(1, amount=10.0), key="c-ada")
        second = ctx.send(order(2, amount=5.5), key="c-ada")
    [receipt] = second.outputs
    assert first.outputs[0]["status"] == "charged"
    assert receipt["customer_total"] == 15.5 and second.memory == {"total": 15.5}
    assert [c.function for c in second.calls] == [
        "examples.payments.fraud_score",
        "payments.charge",
    ]
    assert charges(ledger) == [("c-ada", 10.0), ("c-ada", 5.5)]


def test_a_crash_between_the_score_and_the_charge_charges_once(ledger):
    with app.test_context() as ctx:
        crashed = ctx.send(order(3, "c-bob"), key="c-bob", crash_after_calls=1)
        assert crashed.crashed and crashed.outputs == [] and charges(ledger) == []
        again = ctx.redeliver(crashed)  # the restart: the score replays, the charge runs
        assert (again.replayed, again.executed) == (1, 1)
        once_more = ctx.redeliver(again)  # delivered again after it finished: all replayed
    assert once_more.executed == 0 and once_more.outputs == again.outputs
    assert charges(ledger) == [("c-bob", 10.0)]


def test_a_crash_after_the_charge_is_journaled_replays_it(ledger):
    with app.test_context() as ctx:
        crashed = ctx.send(order(4, "c-cyd"), key="c-cyd", crash_after_calls=2)
        assert crashed.crashed and [c.status for c in crashed.calls] == ["SUCCEEDED"] * 2
        again = ctx.redeliver(crashed)
    assert (again.replayed, again.executed) == (2, 0)
    assert again.outputs[0]["charge_id"] == crashed.calls[1].call_id
    assert charges(ledger) == [("c-cyd", 10.0)]
