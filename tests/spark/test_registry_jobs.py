"""The Spark jobs on registry-framed topics, against a real registry (Apicurio), issue 52.

One input partition holds orders written by two producers (Order v1 and v2, each framed
with its registry id); the ActionState topic holds what a deploy on ActionState v5 left
(framed with v5's id): the call of input 0 SUCCEEDED with a result the code would never
compute, the call of input 1 PENDING. Then, in the order an operator would run them:

* audit counts both slots (executors decode by writer id);
* reconcile settles the PENDING call from a ledger and writes the CallResult with
  today's writer (v6, its own id);
* backfill (journal on) decodes the inputs by their writer ids, replays inputs 0 and 1
  from the mixed-version journal and executes inputs 2 and 3.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from confluent_kafka import Producer

from agents_stream import App
from agents_stream.durable.identity import args_digest, function_id
from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.journal import JournalCodec
from agents_stream.serde.registry import RegistryBinding
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions
from agents_stream.serde.values import value_codec
from agents_stream.spark.jobs.audit import run_audit
from agents_stream.spark.jobs.backfill import run_backfill
from agents_stream.spark.jobs.reconcile import Ledger, run_reconcile
from agents_stream.testing.topics import create_topics, read_topic
from tests.apps import registry_app

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.kafka_only]

ACTION = "Billing.bill#0"


def test_audit_reconcile_backfill_on_registry_framed_topics(
    spark: Any, broker: Any, schema_registry: Any, topic_factory: Any, tmp_path: Path
) -> None:
    url = schema_registry.url
    app_id, inp, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    state = f"{app_id}-action-state"
    create_topics(broker.bootstrap, [inp], partitions=1)
    TopicAdmin(broker.bootstrap).ensure([compacted(state, 1)])
    app = App(app_id, schema_registry_url=url)
    app.agent(
        registry_app.Billing,
        input=inp,
        output=out,
        input_schema=registry_app.ORDER_V2,
        output_schema=registry_app.RECEIPT,
    )
    v1 = value_codec(registry_app.ORDER_V1, registry_url=url, topic=inp)
    v2 = value_codec(registry_app.ORDER_V2, registry_url=url, topic=inp)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "log_level": 0}
    )
    orders = [
        (v1, {"order": "o0", "amount": 1.0}),
        (v1, {"order": "o1", "amount": 2.0}),
        (v2, {"order": "o2", "amount": 3.0, "currency": "USD"}),
        (v2, {"order": "o3", "amount": 4.0, "currency": "GBP"}),
    ]
    for n, (codec, order) in enumerate(orders):
        producer.produce(inp, codec.encode(order), key=f"k{n}".encode(), partition=0)
    versions = load_versions(JOURNAL_RECORD_TYPE)
    v5 = next(v for v in versions if v.version == 5)
    binding = RegistryBinding(url, f"{state}-value")
    old = JournalCodec(AvroSerde(versions, writer=v5, registry=binding))
    to_cents, digest = function_id(registry_app.to_cents), args_digest
    done = ActionRef("k0", 0, ACTION, 0, inp)
    pending = ActionRef("k1", 1, ACTION, 0, inp)
    pending_id = pending.call_id(app_id, 0)
    entries = [
        CallEntry(done, 0, to_cents, digest((1.0,), {}), CallStatus.SUCCEEDED,
                  json.dumps(4242).encode(), call_id=done.call_id(app_id, 0)),
        CallEntry(pending, 0, to_cents, digest((2.0,), {}), CallStatus.PENDING, None,
                  call_id=pending_id),
    ]  # fmt: skip
    for entry in entries:
        producer.produce(state, old.encode(entry), key=entry_key_bytes(entry), partition=0)
    assert producer.flush(30) == 0
    input_ids = {int.from_bytes(r.value[1:5], "big") for r in read_topic(broker.bootstrap, inp)}
    assert len(input_ids) == 2

    audit = run_audit(spark, app, broker.bootstrap, None, outputs=False).summary
    assert (audit["calls_succeeded"], audit["calls_pending"]) == (1, 1), audit
    assert audit["undecodable_records"] == 0 and audit["in_flight_action_states"] == 2, audit
    assert audit["inputs_missing_state"] == 4, audit  # no input has its ActionDone yet

    ledger = tmp_path / "ledger.parquet"
    pd.DataFrame(
        {"call_id": [pending_id], "status": ["SUCCEEDED"], "result": [json.dumps(777)]}
    ).to_parquet(ledger)
    settled = run_reconcile(spark, app, broker.bootstrap, Ledger(str(ledger)), force=True)
    assert settled.summary["pending"] == settled.summary["written"] == 1, settled.summary
    journal = [r.value for r in read_topic(broker.bootstrap, state) if r.value]
    writer_ids = [int.from_bytes(v[1:5], "big") for v in journal]
    assert len(journal) == 3 and len(set(writer_ids)) == 2  # v5's id, then v6's

    result = run_backfill(spark, app, broker.bootstrap, output_path=tmp_path / "out")
    assert result.summary["records"] == 4, result.summary
    assert result.summary["calls_executed"] == 2, result.summary  # inputs 2 and 3
    assert result.summary["errors"] == 0, result.summary
    receipt = value_codec(registry_app.RECEIPT, registry_url=url, topic=out)
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    got = {r["key"]: receipt.decode(bytes(r["value"])) for r in rows}
    assert got == {
        "k0": {"order": "o0", "amount_cents": 4242, "currency": "EUR"},  # v5 journal replayed
        "k1": {"order": "o1", "amount_cents": 777, "currency": "EUR"},  # reconciled
        "k2": {"order": "o2", "amount_cents": 300, "currency": "USD"},
        "k3": {"order": "o3", "amount_cents": 400, "currency": "GBP"},
    }
