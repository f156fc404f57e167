"""Avro input and output topics through the worker: values are decoded with the agent's
input schema, outputs encoded with its output schema, and a record that is not Avro of the
input schema goes to the DLQ."""

from __future__ import annotations

import pytest

from agents_stream.serde.values import value_codec
from agents_stream.testing.topics import create_topics, produce, wait_for_records
from tests.apps.avro_app import ORDER, RECEIPT

pytestmark = pytest.mark.broker


def test_avro_in_avro_out_and_foreign_records_dead_lettered(broker, topic_factory, worker_factory):
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    orders = value_codec(ORDER)
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [("c-1", orders.encode({"order": f"o-{i}", "amount": 1.25 * i})) for i in range(5)]
        + [("c-2", b'{"order": "json is not avro"}')],
        raw=True,
    )
    worker_factory("tests.apps.avro_app:app", env)
    receipts = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 5)
    decoded = sorted(
        (value_codec(RECEIPT).decode(r.value) for r in receipts), key=lambda v: v["order"]
    )
    assert decoded == [
        {"order": f"o-{i}", "amount_cents": round(125 * i), "customer": "c-1"} for i in range(5)
    ]
    [dead] = wait_for_records(broker.bootstrap, f"{env['AS_INPUT']}-dlq", 1)
    assert dead.headers["x-error-stage"] == b"decode"
    assert dead.value == b'{"order": "json is not avro"}'
