"""Guarantee 5 end to end: journals written by every released ActionState schema version
are recovered and replayed by a worker on the newest code (issue 4).

Before any worker runs, the test produces the inputs (one partition, so each input's
offset is its ``seq``) and writes, straight into the ActionState topic, the journal an
older deploy would have left for them: each entry encoded by a v1, v2 or v3 writer, keyed
by ``entry_key_bytes`` and sent to the input's partition. A worker on today's code then
rebuilds its cache from that topic and processes the inputs; side effects counted in
SQLite show what was replayed (0 effects) versus executed or reconciled.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from agents_stream.durable.identity import args_digest, function_id
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    JournalEntry,
)
from agents_stream.durable.keys import call_key, entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.journal import JournalCodec, default_journal_codec
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps import versions_app
from tests.apps.effects import connect

pytestmark = pytest.mark.broker

APP = "tests.apps.versions_app:app"
ACTION = "Versions.process#0"  # first (only) action run of each input record
SCENARIOS = ["v1-result", "v1-exception", "v2-pending", "v3-succeeded", "mixed", "v1-done", "fresh"]

# Function ids exactly as the worker computes them (module + qualname, or the
# DurableCallable id): a mismatch would truncate the slot instead of replaying it.
LOOKUP = function_id(versions_app.lookup)
CHARGE = function_id(versions_app.charge_card)
SCORE = function_id(versions_app.score)
TRANSFER = versions_app.Transfer().function_id
DECLINED = ExceptionInfo(
    f"{versions_app.Declined.__module__}.{versions_app.Declined.__qualname__}",
    "card declined (journaled by v1)",
    "Traceback (most recent call last): ...",
)


def writers() -> dict[int, JournalCodec]:
    """One codec per released schema version, each *writing* with that version (as
    scripts/make_golden.py does); all of them read with the newest."""
    versions = load_versions(JOURNAL_RECORD_TYPE)
    assert [v.version for v in versions][:3] == [1, 2, 3]
    return {v.version: JournalCodec(AvroSerde(versions, writer=v)) for v in versions}


def digest(n: int) -> str:
    # The context digests the call's own arguments; the injected call_id is not one.
    return args_digest((n,), {})


def payload(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def journal_for(
    scenario: str, ref: ActionRef, n: int, app_id: str
) -> list[tuple[int, JournalEntry]]:
    """(writer version, entry) pairs an older deploy left for ``scenario``."""

    def v1_result(i: int) -> CallEntry:  # v1 has no status: a result means SUCCEEDED
        return CallEntry(
            ref, i, LOOKUP, digest(n), CallStatus.SUCCEEDED, payload({"n": n, "by": "journal-v1"})
        )

    def v1_exception(i: int) -> CallEntry:  # ...and an exception means FAILED
        return CallEntry(ref, i, CHARGE, digest(n), CallStatus.FAILED, None, DECLINED)

    def v2_pending(i: int) -> CallEntry:
        return CallEntry(
            ref, i, TRANSFER, digest(n), CallStatus.PENDING, started_ms=1_700_000_000_000
        )

    def v3_succeeded(i: int) -> CallEntry:
        return CallEntry(
            ref,
            i,
            SCORE,
            digest(n),
            CallStatus.SUCCEEDED,
            payload({"n": n, "by": "journal-v3"}),
            call_id=ref.call_id(app_id, i),
            started_ms=1_700_000_000_000,
            finished_ms=1_700_000_000_100,
            attempts=2,
            worker_id="old-deploy",
        )

    if scenario == "v1-result":
        return [(1, v1_result(0))]
    if scenario == "v1-exception":
        return [(1, v1_exception(0))]
    if scenario == "v2-pending":
        return [(2, v2_pending(0))]
    if scenario == "v3-succeeded":
        return [(3, v3_succeeded(0))]
    if scenario == "mixed":
        return [(1, v1_result(0)), (1, v1_exception(1)), (2, v2_pending(2)), (3, v3_succeeded(3))]
    if scenario == "v1-done":  # completed, outputs not yet acknowledged downstream
        out = {"scenario": scenario, "n": n, "by": "journal-v1"}
        return [
            (1, ActionDone(ref, outputs=(payload(out),), calls=0, finished_ms=1, emitted=False))
        ]
    return []  # "fresh": nothing journaled, the control that side effects are counted


def write_journal(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0, "journal records left unsent"


def effects(db_path: Path) -> Counter[str]:
    db = connect(str(db_path))
    rows = db.execute("SELECT kind FROM effects").fetchall()
    db.close()
    return Counter(kind for (kind,) in rows)


def test_worker_replays_journals_of_every_schema_version(
    broker, topic_factory, worker_factory, tmp_path
):
    app_id = topic_factory("app")
    state_topic = f"{app_id}-action-state"
    db_path = tmp_path / "effects.sqlite"
    connect(str(db_path)).close()
    env = {
        "AS_APP_ID": app_id,
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db_path),
    }
    # One input partition keeps offsets predictable; the ActionState topic is created as
    # the worker would (compacted, co-partitioned) so the worker finds it already there.
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=1)
    TopicAdmin(broker.bootstrap).ensure([compacted(state_topic, 1)])

    inputs = {s: 10 + i for i, s in enumerate(SCENARIOS)}  # scenario -> n
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [(f"key-{s}", {"scenario": s, "n": n}) for s, n in inputs.items()],
    )
    # seq and partition come from where the inputs actually landed, not from assumptions.
    placed = {r.json()["scenario"]: r for r in read_topic(broker.bootstrap, env["AS_INPUT"])}
    assert sorted(placed) == sorted(SCENARIOS)

    codecs = writers()
    headers = {v: c.serde.header() for v, c in codecs.items()}
    assert len(set(headers.values())) == len(headers), "writers must differ on the wire"
    records: list[tuple[int, bytes, bytes]] = []
    for scenario, n in inputs.items():
        rec = placed[scenario]
        ref = ActionRef(f"key-{scenario}", rec.offset, ACTION, rec.partition)
        for version, entry in journal_for(scenario, ref, n, app_id):
            value = codecs[version].encode(entry)
            assert value.startswith(headers[version])
            records.append((rec.partition, entry_key_bytes(entry), value))
    write_journal(broker.bootstrap, state_topic, records)

    worker = worker_factory(APP, env)
    outs = {
        r.json()["scenario"]: r.json()
        for r in wait_for_records(broker.bootstrap, env["AS_OUTPUT"], len(SCENARIOS), timeout=90)
    }
    assert sorted(outs) == sorted(SCENARIOS), worker.log()

    declined = "Declined: card declined (journaled by v1)"
    n = inputs
    assert outs["v1-result"]["lookup"] == {"n": n["v1-result"], "by": "journal-v1"}
    assert outs["v1-exception"]["caught"] == declined
    assert outs["v2-pending"]["transfer"] == {"amount": n["v2-pending"], "by": "reconciler"}
    assert outs["v3-succeeded"]["score"] == {"n": n["v3-succeeded"], "by": "journal-v3"}
    mixed = outs["mixed"]
    assert mixed["lookup"] == {"n": n["mixed"], "by": "journal-v1"}
    assert mixed["caught"] == declined
    assert mixed["transfer"] == {"amount": n["mixed"], "by": "reconciler"}
    assert mixed["score"] == {"n": n["mixed"], "by": "journal-v3"}
    assert outs["v1-done"]["by"] == "journal-v1"
    assert outs["fresh"]["lookup"] == {"n": n["fresh"], "by": "executed"}
    # Replayed slots ran nothing; PENDING slots ran the reconciler, never the call; only
    # the unjournaled control input executed its function.
    assert effects(db_path) == {"reconcile": 2, "lookup": 1}, worker.log()

    assert worker.terminate() == 0, worker.log()
    assert "non-deterministic replay" not in worker.log()  # every slot matched its call

    # The reconciled PENDING slot was finalized in place by today's writer.
    newest = default_journal_codec()
    pending = placed["v2-pending"]
    key = call_key(ActionRef("key-v2-pending", pending.offset, ACTION, pending.partition), 0)
    finals = [
        newest.decode(key, r.value)
        for r in read_topic(broker.bootstrap, state_topic)
        if r.key == key.decode()
        and r.value is not None
        and r.value.startswith(headers[max(headers)])
    ]
    assert [(e.status, e.worker_id != "") for e in finals if isinstance(e, CallEntry)] == [
        (CallStatus.SUCCEEDED, True)
    ]
