"""A rolling upgrade of two workers across journal schema versions, on Apache Kafka and a
real registry (Apicurio), issue 52.

Two workers of the release that knew ActionState v1..v5 (``AS_JOURNAL_VERSION=5``) share
four input partitions; then each in turn is stopped (SIGTERM, as a deploy does) and
started again as the release that knew v1..v6 (``AS_JOURNAL_VERSION=6``: today's code
with its newest schema pinned to v6, which writes no completion groups; v6 -> v7 goes one
way, tests/fault/test_rolling_upgrade.py). In between, each partition is owned by either kind in
turn: the new worker rebuilds caches from v5 records, and the old one, while it still
runs, takes partitions the new one wrote v6 records to and reads them by their writer's
registry id (v6 only adds a field with a default: its records resolve onto v5).
Inputs come from an idempotent producer between the steps. At the end: every order has
its receipt, no charge ran twice (side effects counted in SQLite), both writer ids are
in the journal, and no worker stopped or logged a CRITICAL line.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions
from agents_stream.serde.values import value_codec
from agents_stream.testing.topics import create_topics, read_topic, wait_for_records
from tests.apps import registry_app
from tests.apps.effects import connect
from tests.fault.fleet import assert_survivors

pytestmark = [pytest.mark.broker, pytest.mark.kafka_only]

APP = "tests.apps.registry_app:app"
PARTITIONS = 4


def _env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTS_STREAM_")}
    env["AGENTS_STREAM_SCHEMA_REGISTRY"] = url
    env.update(extra)
    return env


def test_rolling_upgrade_of_two_workers_on_mixed_journal_versions(
    broker: Any, schema_registry: Any, topic_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    url = schema_registry.url
    app_id, inp, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    db = str(tmp_path / "effects.db")
    connect(db).close()
    common = {"AS_APP_ID": app_id, "AS_INPUT": inp, "AS_OUTPUT": out, "AS_EFFECTS_DB": db}
    create_topics(broker.bootstrap, [inp], partitions=PARTITIONS)
    TopicAdmin(broker.bootstrap).ensure([compacted(f"{app_id}-action-state", PARTITIONS)])
    orders = value_codec(registry_app.ORDER_V2, registry_url=url, topic=inp)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "log_level": 0}
    )
    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        for i in range(sent, sent + n):
            value = orders.encode({"order": f"o{i}", "amount": i / 4, "currency": "EUR"})
            producer.produce(inp, value, key=f"k{i % 12}".encode())
        sent += n
        assert producer.flush(30) == 0

    def outputs(workers: list[Any]) -> None:
        try:
            wait_for_records(broker.bootstrap, out, sent, timeout=90)
        except TimeoutError:
            raise AssertionError("\n".join(w.log()[-3000:] for w in workers)) from None

    def start(name: str, version: str | None) -> Any:
        extra = {"AS_JOURNAL_VERSION": version} if version else {}
        worker = worker_factory(
            APP,
            _env(url, **common, **extra),
            extra_args=["--data-dir", str(tmp_path / name), "--shutdown-timeout", "20"],
        )
        # Holding partitions before the step goes on: the other worker alone could make
        # every output meanwhile, and a SIGTERM that then reached this one while Python
        # was still starting (before its handler) ended it with -15 (seen once).
        deadline = time.monotonic() + 90
        while "; ready: processing them" not in worker.log():
            assert time.monotonic() < deadline and worker.alive, worker.log()[-3000:]
            time.sleep(0.2)
        return worker

    old_a, old_b = start("a", "5"), start("b", "5")
    produce(24)
    outputs([old_a, old_b])
    # Upgrade b: its partitions go to old a, then come back to new b (v6 writes).
    assert old_b.terminate() == 0, old_b.log()
    new_b = start("b", "6")
    produce(24)
    outputs([old_a, new_b])
    # new b stops once more: old a takes every partition, v6 records included.
    assert new_b.terminate() == 0, new_b.log()
    produce(12)
    outputs([old_a])
    new_b = start("b", "6")
    produce(12)
    outputs([old_a, new_b])
    # Upgrade a: new b holds everything meanwhile (reads a's v5 records), then shares.
    assert old_a.terminate() == 0, old_a.log()
    produce(12)
    outputs([new_b])
    new_a = start("a", "6")
    produce(12)
    outputs([new_a, new_b])
    time.sleep(1.0)  # a late duplicate output would land by now

    workers = [new_a, new_b]
    assert_survivors(workers)
    for old in (old_a,):
        assert "CRITICAL" not in old.log(), old.log()
    receipts = [r for r in read_topic(broker.bootstrap, out)]
    receipt = value_codec(registry_app.RECEIPT, registry_url=url, topic=out)
    got = sorted(receipt.decode(r.value)["order"] for r in receipts)
    assert got == sorted(f"o{i}" for i in range(sent)), got  # each order once
    with connect(db) as conn:
        charges = conn.execute(
            "SELECT call_id, COUNT(*) FROM effects WHERE kind = 'charge' GROUP BY call_id"
        ).fetchall()
    assert len(charges) == sent and all(n == 1 for _, n in charges), charges
    # Both releases wrote the journal, each framed with its own registry id.
    ids = {
        int.from_bytes(r.value[1:5], "big")
        for r in read_topic(broker.bootstrap, f"{app_id}-action-state")
        if r.value
    }
    assert len(ids) == 2, ids
    assert len(load_versions(JOURNAL_RECORD_TYPE)) >= 7  # today's code, pinned to v6
    for w in workers:
        assert w.terminate() == 0, w.log()
