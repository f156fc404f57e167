"""The test kit's LiveWorker: the payments agent on the session's broker, a worker in
this process, orders in and receipts out through the app's codecs."""

from __future__ import annotations

import pytest

from agents_stream import App
from agents_stream.testing import LiveWorker
from examples import payments

pytestmark = pytest.mark.broker


def test_live_worker_runs_an_agent_on_a_real_broker(broker, topic_factory, tmp_path, monkeypatch):
    monkeypatch.setattr(payments.PROVIDER, "path", str(tmp_path / "ledger.sqlite"))
    monkeypatch.setattr(payments.PROVIDER, "_db", None)
    monkeypatch.setattr(payments.random, "random", lambda: 0.5)  # no provider timeouts
    app = App(topic_factory("app"), partitions=2)
    app.agent(payments.Payments, input=topic_factory("orders"), output=topic_factory("receipts"))
    with LiveWorker(app, broker=broker.url, data_dir=tmp_path / "data") as live:
        for n, amount in enumerate([10.0, 2.5]):
            live.send({"order": f"o-{n}", "customer": "c-ada", "amount": amount}, key="c-ada")
        receipts = live.outputs(2, timeout=90)
    assert [r["customer_total"] for r in receipts] == [10.0, 12.5]
    payments.PROVIDER._db = None
