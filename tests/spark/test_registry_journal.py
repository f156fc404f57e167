"""Spark reads registry-framed journal records (issue 52): records written by two
ActionState versions, each framed with its registry id, decode to journal rows on the
executors, whose writer schemas are fetched by id from a real registry (Apicurio)."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer

from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.journal import JournalCodec
from agents_stream.serde.registry import RegistryBinding
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions
from agents_stream.spark.frames.action_state import read_journal


def test_read_journal_resolves_writer_schemas_by_registry_id(
    spark: Any, broker: Any, schema_registry: Any, kafka_topic: Any
) -> None:
    topic = kafka_topic(1)
    url = schema_registry.url
    versions = load_versions(JOURNAL_RECORD_TYPE)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    ids = set()
    for n, writer in enumerate((versions[4], versions[5])):  # v5, then v6
        binding = RegistryBinding(url, f"{topic}-value")
        codec = JournalCodec(AvroSerde(versions, writer=writer, registry=binding))
        ref = ActionRef(f"user-{n}", n, "Scoring.process#0", 0, "user-events")
        entry = CallEntry(
            ref, 0, "m.fetch", "digest", CallStatus.SUCCEEDED, json.dumps({"v": n}).encode()
        )
        value = codec.encode(entry)
        ids.add(int.from_bytes(value[1:5], "big"))
        producer.produce(topic, key=entry_key_bytes(entry), value=value, partition=0)
    assert producer.flush(30) == 0
    assert len(ids) == 2  # two writer schemas, two ids

    rows = read_journal(spark, broker.bootstrap, topic, registry_url=url).collect()
    got = sorted((r["key"], r["kind"], r["status"], r["result_json"]) for r in rows)
    assert got == [
        ("user-0", "call", "SUCCEEDED", '{"v": 0}'),
        ("user-1", "call", "SUCCEEDED", '{"v": 1}'),
    ], [r.asDict() for r in rows]
