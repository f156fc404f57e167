"""The Faust host registers its schemas at start-up, like the worker (issue 52), against
a real registry (Apicurio) on Apache Kafka: a refusal crashes the Faust app in one
CRITICAL line before any record runs (nothing dead-lettered, nothing output); once the
registry accepts, the same record runs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from agents_stream.serde.registry import ensure_registered, registry_client
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions
from agents_stream.testing.topics import create_topics, read_topic, wait_for_records
from tests.fault.scenario import wait_log

pytest.importorskip("faust")

pytestmark = [pytest.mark.broker, pytest.mark.kafka_only]

MODULE = "tests.faust.app"


def test_faust_host_registers_at_startup_and_stops_on_a_refusal(
    broker: Any, schema_registry: Any, topic_factory: Any, faust_factory: Any, tmp_path: Path
) -> None:
    url = schema_registry.url
    app_id, inp, out = topic_factory("faust"), topic_factory("in"), topic_factory("out")
    subject = f"{app_id}-action-state-value"
    client = registry_client(url)
    client.set_compatibility(subject, "FULL")  # v7 is not FULL-compatible with v1-v3
    for version in load_versions(JOURNAL_RECORD_TYPE)[:3]:
        ensure_registered(url, subject, version)
    create_topics(broker.bootstrap, [inp], partitions=2)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "log_level": 0}
    )
    producer.produce(inp, json.dumps({"n": 7}).encode(), key=b"k7")
    assert producer.flush(30) == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTS_STREAM_")}
    env.update(
        AGENTS_STREAM_SCHEMA_REGISTRY=url,
        AS_BROKER=broker.url,
        AS_DATA_DIR=str(tmp_path / "data"),
        AS_APP_ID=app_id,
        AS_INPUT=inp,
        AS_OUTPUT=out,
        AS_EFFECTS_DB=str(tmp_path / "effects.db"),
    )

    refused = faust_factory(MODULE, env)
    deadline = time.monotonic() + 90
    while refused.alive and time.monotonic() < deadline:
        time.sleep(0.2)
    log = refused.log()
    assert not refused.alive and refused.proc.returncode != 0, log
    # Ours, then Faust's own crash report ("[^Worker]: We experienced a crash!").
    critical = [line for line in log.splitlines() if "CRITICAL" in line and "[^Worker]" not in line]
    assert len(critical) == 1, log
    for phrase in ("Faust app stopped: schema registry", subject, "refused", "HTTP 409"):
        assert phrase in critical[0], critical[0]
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
    assert read_topic(broker.bootstrap, out) == []

    client.set_compatibility(subject, "NONE")  # the operator fixes the rule
    accepted = faust_factory(MODULE, env)
    wait_log(accepted, "registered ActionState v8 as id", timeout=90)
    [receipt] = wait_for_records(broker.bootstrap, out, 1, timeout=90)
    assert json.loads(receipt.value)["n"] == 7
    assert "CRITICAL" not in accepted.log()
    assert accepted.terminate() == 0, accepted.log()
