"""``spark audit`` against a workload with known stuck, failed, truncated, missing and
duplicated cases (worker-produced plus crafted journal records)."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from agents_stream import App
from agents_stream.durable.journal import ActionDone, ActionRef
from agents_stream.durable.output_identity import OUTPUT_HEADER
from agents_stream.spark.frames import ActionStateWriter
from agents_stream.spark.jobs import audit
from agents_stream.spark.jobs.audit import run_audit
from agents_stream.testing.topics import create_topics, produce, read_topic
from tests.apps.spark_app import Pipeline
from tests.spark.workload import APP_SPEC, PROCESS, SparkAppEnv, craft_anomalies, normal_inputs

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_audit_counts_known_anomalies(spark, broker, topic_factory, worker_factory, tmp_path):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    env.send(
        [
            *normal_inputs(6),
            ("f0", {"n": 100, "scenario": "fail"}),
            ("f1", {"n": 101, "scenario": "fail"}),
        ]
    )
    worker = worker_factory(APP_SPEC, env.env)
    outputs = env.outputs(8)
    time.sleep(1.0)  # let the worker commit the processed offsets
    assert worker.terminate() == 0, worker.log()

    now_ms = int(time.time() * 1000)
    craft_anomalies(env, now_ms)
    env.send([("late-a", {"n": 200}), ("late-b", {"n": 201}), ("late-c", {"n": 202})])
    dup = outputs[0]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for _ in range(2):  # the same output emitted twice more: 2 duplicate records
        producer.produce(env.output, value=dup.value, key=dup.key.encode())
    assert producer.flush(30) == 0
    assert len(read_topic(broker.bootstrap, env.output)) == 10

    out = tmp_path / "audit"
    result = run_audit(spark, env.app(), broker.bootstrap, out, stuck_after_s=300, now_ms=now_ms)
    s = result.summary
    assert s["action_states"] == 6 * 2 + 2 + 3
    assert s["completed_action_states"] == 6 * 2 + 2 + 1
    assert s["in_flight_action_states"] == 2
    assert (s["calls_succeeded"], s["calls_failed"], s["calls_pending"]) == (12, 3, 2)
    assert s["stuck_calls"] == 1
    assert s["truncations"] == 1
    assert s["undecodable_records"] == 1
    assert s["inputs_missing_state"] == 3
    assert s["inputs_missing_state_uncommitted"] == 3
    assert (s["duplicate_output_groups"], s["duplicate_output_records"]) == (1, 2)

    [stuck] = result.tables["stuck"].collect()
    assert (stuck["key"], stuck["seq"], stuck["call_id"]) == (
        "s1",
        1000,
        f"{env.app_id}:s1:1000:Pipeline.process#0:0",
    )
    failures = {r["exception_type"]: r["calls"] for r in result.tables["failures"].collect()}
    assert failures == {"builtins.ValueError": 2, "builtins.TimeoutError": 1}
    missing = sorted(r["key"] for r in result.tables["missing_inputs"].collect())
    assert missing == ["late-a", "late-b", "late-c"]
    [dup_row] = result.tables["duplicate_outputs"].collect()
    assert (dup_row["key"], dup_row["records"], dup_row["expected"]) == (dup.key, 3, 1)

    assert json.loads((out / "summary.json").read_text()) == s
    _same_audit_in_spark(spark, env.app(), broker.bootstrap, result, now_ms)
    assert spark.read.parquet(str(out / "stuck")).count() == 1
    page = (out / "report.html").read_text()
    assert "<svg" in page and "Pipeline.process SUCCEEDED" in page
    assert "## stuck (1)" in (out / "report.md").read_text()


def test_audit_matches_inputs_by_topic_with_pre_v5_entries_on_the_first(
    spark, broker, topic_factory, tmp_path
):
    """One agent on two input topics whose records share partition, offset and key: a
    completion on one topic never vouches for the other's record, and entries journaled
    before v5 (no topic) belong to the first input topic only."""
    app_id = topic_factory("app")
    in_a, in_b, out_a, out_b = (topic_factory(p) for p in ("in-a", "in-b", "out-a", "out-b"))
    app = App(app_id, prune_completed=False, partitions=1)
    app.agent(Pipeline, input=in_a, output=out_a)
    app.agent(Pipeline, input=in_b, output=out_b)
    create_topics(broker.bootstrap, [in_a, in_b, out_a, out_b, app.action_state_topic], 1)
    for topic in (in_a, in_b):  # k0@0, k1@1, k2@2 on both topics
        produce(broker.bootstrap, topic, [(f"k{i}", {"n": i}) for i in range(3)])

    out = b'{"n": 1}'
    entries = [
        ActionDone(ActionRef("k0", 0, PROCESS, 0, topic=""), outputs=()),  # pre-v5: in_a
        ActionDone(ActionRef("k1", 1, PROCESS, 0, topic=in_a), outputs=(out,)),
        ActionDone(ActionRef("k1", 1, PROCESS, 0, topic=in_b), outputs=(out,)),
        ActionDone(ActionRef("k2", 2, PROCESS, 0, topic=in_b), outputs=()),
    ]
    with ActionStateWriter(broker.bootstrap, app.action_state_topic) as writer:
        writer.write((0, e) for e in entries)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for _ in range(2):  # in_a's output twice: B's completion must not account for it
        producer.produce(out_a, key=b"k1", value=out)
    producer.produce(out_b, key=b"k1", value=out)
    assert producer.flush(30) == 0
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": app_id})
    group.commit(offsets=[TopicPartition(in_a, 0, 3)], asynchronous=False)
    group.close()

    result = run_audit(spark, app, broker.bootstrap, None)

    missing = sorted(
        (r["topic"], r["offset"], r["key"], r["state"], r["committed"])
        for r in result.tables["missing_inputs"].collect()
    )
    assert missing == [
        (in_a, 2, "k2", "absent", True),
        (in_b, 0, "k0", "absent", False),
    ]
    assert result.summary["inputs_missing_state_uncommitted"] == 1
    dups = [
        (r["topic"], r["records"], r["expected"])
        for r in result.tables["duplicate_outputs"].collect()
    ]
    assert dups == [(out_a, 2, 1)]


async def _lookup(value: dict) -> dict:
    return value


def test_audit_counts_duplicate_outputs_by_their_identity(spark, broker, topic_factory):
    """Outputs carrying their identity header are duplicates only when an identity
    repeats, also with no journal left to compare against (pruned): the same content
    sent by two actions is not flagged. Outputs without one are counted by content."""
    app_id, inp, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    aio_in, aio_out = topic_factory("aio-in"), topic_factory("aio-out")
    app = App(app_id, partitions=1)
    app.agent(Pipeline, input=inp, output=out)
    app.async_io(_lookup, input=aio_in, output=aio_out)
    create_topics(broker.bootstrap, [inp, out, aio_out, app.action_state_topic], 1)
    ident = f"{app_id}/{inp}/0/{{}}/{PROCESS}/1700000000000/0"
    sent = [
        (b"k", b'{"n": 1}', ident.format(1)),
        (b"k", b'{"n": 1}', ident.format(1)),  # the same output twice: one duplicate
        (b"k", b'{"n": 2}', ident.format(2)),
        (b"k", b'{"n": 2}', ident.format(3)),  # two actions, same content: none
        (b"k", b'{"n": 3}', None),
        (b"k", b'{"n": 3}', None),  # no identity, no journal: one duplicate
    ]
    aio = f"{app_id}/{aio_in}/0/{{}}/async_io:_lookup/1700000000000/0"
    sent_aio = [
        (b"k", b'{"n": 4}', aio.format(4)),
        (b"k", b'{"n": 4}', aio.format(4)),  # re-run after a crash: one duplicate
        (b"k", b'{"n": 5}', aio.format(5)),
        (b"k", b'{"n": 5}', aio.format(6)),  # two inputs, same content: none
    ]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for topic, records in ((out, sent), (aio_out, sent_aio)):
        for key, value, header in records:
            headers = [(OUTPUT_HEADER, header.encode())] if header else None
            producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0

    result = run_audit(spark, app, broker.bootstrap, None, inputs=False)

    dups = sorted(
        (json.loads(r["value"])["n"], r["agent"], r["records"], r["identified"], r["duplicates"])
        for r in result.tables["duplicate_outputs"].collect()
    )
    assert dups == [
        (1, "Pipeline", 2, 2, 1),
        (3, "Pipeline", 2, 0, 1),
        (4, "async_io:_lookup", 2, 2, 1),
    ]
    assert result.summary["duplicate_output_records"] == 3


def _rows(frame, drop=()):
    return sorted(
        (
            tuple(sorted((k, v) for k, v in r.asDict().items() if k not in drop))
            for r in frame.collect()
        ),
        key=repr,
    )


def _same_audit_in_spark(spark, app, bootstrap, result, now_ms):
    """The one-pass audit (readers finish each partition, the driver merges) equals the
    audit computed in Spark from the decoded journal: when a partition is split over
    readers, and when the view is too large to collect."""
    kwargs = dict(stuck_after_s=300, now_ms=now_ms, inputs=False, outputs=False)
    split = run_audit(spark, app, bootstrap, None, maxRecordsPerPartition=7, **kwargs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(audit, "VIEW_ROW_LIMIT", 0)  # every partition overflows
        overflow = run_audit(spark, app, bootstrap, None, **kwargs)
    journal_only = {
        k: v for k, v in result.summary.items() if not k.startswith(("inputs_", "duplicate_"))
    }
    for other in (split, overflow):
        assert other.summary == journal_only
        tables = ("status_counts", "in_flight", "stuck", "stuck_two_phase", "truncations",
                  "undecodable")  # fmt: skip
        for name in tables:
            assert _rows(other.tables[name]) == _rows(result.tables[name]), name
        examples = ("example_message", "example_call_id")  # any row of the group
        assert _rows(other.tables["failures"], examples) == _rows(
            result.tables["failures"], examples
        )
