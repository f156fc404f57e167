"""The worker CLI against the real broker: ordering, scaling, failover, dead letters."""

from __future__ import annotations

import collections
import json
import time

import pytest

from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records

pytestmark = pytest.mark.broker


def env_for(topic_factory):
    app_id = topic_factory("app")
    return {
        "AS_APP_ID": app_id,
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
    }


def assert_per_key_order(records, keys, per_key):
    by_key = collections.defaultdict(list)
    for r in records:
        v = r.json()
        by_key[v["key"]].append(v)
    assert sorted(by_key) == sorted(keys)
    for key, values in by_key.items():
        ns = [v["n"] for v in values]
        assert ns == list(range(per_key)), f"{key}: {ns}"
        assert [v["prev"] for v in values] == [-1, *ns[:-1]]


def owns_some(log: str) -> bool:
    """The worker logged an assignment with partitions in it."""
    return any("assigned " in line and "assigned nothing" not in line for line in log.splitlines())


def wait_assigned(worker, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not owns_some(worker.log()):
        assert worker.alive and time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.2)


def test_events_in_outputs_out_in_per_key_order(broker, topic_factory, worker_factory):
    env = env_for(topic_factory)
    keys = [f"user-{i}" for i in range(12)]
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=3)
    produce(broker.bootstrap, env["AS_INPUT"], [(k, {"n": n}) for n in range(20) for k in keys])
    worker = worker_factory("tests.apps.ordering:app", env)
    records = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 240, timeout=90)
    assert len(records) == 240, worker.log()
    assert_per_key_order(records, keys, 20)
    assert all(r.key == r.json()["key"] for r in records)  # output keeps the input key
    assert worker.terminate() == 0
    assert "stopped" in worker.log()


def test_outputs_keep_per_key_order_when_the_next_record_starts_before_their_ack(
    broker, topic_factory, worker_factory
):
    """Records without key state run on the batch path, where a key's next record
    starts once the previous ActionDone is acked and its outputs are produced, not
    acked: the outputs must still come out in input order per key."""
    env = env_for(topic_factory)
    keys = [f"user-{i}" for i in range(12)]
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=3)
    produce(broker.bootstrap, env["AS_INPUT"], [(k, {"n": n}) for n in range(60) for k in keys])
    worker = worker_factory("tests.apps.stateless_order:app", env)
    records = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 1440, timeout=90)
    assert len(records) == 1440, worker.log()
    by_key = collections.defaultdict(list)
    for r in records:
        v = r.json()
        by_key[v["key"]].append((v["n"], v["part"]))
    assert sorted(by_key) == sorted(keys)
    for key, seen in by_key.items():
        assert seen == [(n, part) for n in range(60) for part in range(2)], key
    assert worker.terminate() == 0


@pytest.mark.kafka_proof
def test_two_workers_share_partitions_and_failover(broker, topic_factory, worker_factory):
    env = env_for(topic_factory)
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=4)
    keys = [f"k{i}" for i in range(16)]
    first = worker_factory("tests.apps.ordering:app", env)
    wait_assigned(first)
    second = worker_factory("tests.apps.ordering:app", env)
    # Produce only once both share the partitions: Apache Kafka (rebalance delay 0)
    # hands all four to the first member at once, which would drain every record
    # before the second joins.
    deadline = time.monotonic() + 90
    while not (owns_some(second.log()) and "revoked" in first.log()):
        assert time.monotonic() < deadline, (first.log()[-3000:], second.log()[-3000:])
        time.sleep(0.2)
    produce(broker.bootstrap, env["AS_INPUT"], [(k, {"n": 0}) for k in keys])
    records = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 16, timeout=90)
    pids = {r.json()["pid"] for r in records}
    assert pids == {first.proc.pid, second.proc.pid}, (first.log(), second.log())

    first.kill()
    produce(broker.bootstrap, env["AS_INPUT"], [(k, {"n": 1}) for k in keys])
    records = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 32, timeout=90)
    survivors = [r.json() for r in records if r.json()["n"] == 1]
    assert {v["key"] for v in survivors} == set(keys)
    assert {v["pid"] for v in survivors} == {second.proc.pid}
    # memory moved with the partitions: prev of n=1 is the n=0 written by either worker
    assert all(v["prev"] == 0 for v in survivors)


def test_malformed_input_goes_to_dlq_and_processing_continues(
    broker, topic_factory, worker_factory
):
    env = env_for(topic_factory)
    inp = env["AS_INPUT"]
    create_topics(broker.bootstrap, [inp], partitions=2)
    produce(broker.bootstrap, inp, [("a", b"{not json"), ("a", b"\xff\xfe")], raw=True)
    produce(
        broker.bootstrap, inp, [("a", {"n": 0}), ("b", {"n": 0, "explode": True}), ("b", {"n": 0})]
    )
    worker = worker_factory("tests.apps.ordering:app", env)
    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 2, timeout=90)
    dlq = wait_for_records(broker.bootstrap, f"{inp}-dlq", 3, timeout=30)
    stages = collections.Counter(r.headers["x-error-stage"].decode() for r in dlq)
    assert stages == {"decode": 2, "action": 1}
    values = {r.value for r in dlq}
    assert b"{not json" in values and b"\xff\xfe" in values
    boom = next(r for r in dlq if r.headers["x-error-stage"] == b"action")
    assert b"asked to explode" in boom.headers["x-error-message"]
    assert boom.headers["x-source-topic"].decode() == inp
    assert {json.loads(r.value)["key"] for r in outputs} == {"a", "b"}
    assert worker.alive
    # everything, including the dead letters, was committed
    time.sleep(1.5)
    assert worker.terminate() == 0
    again = worker_factory("tests.apps.ordering:app", env)
    time.sleep(8)
    assert len(read_topic(broker.bootstrap, env["AS_OUTPUT"])) == 2, again.log()
    assert len(read_topic(broker.bootstrap, f"{inp}-dlq")) == 3


def test_in_flight_limit_pauses_and_resumes_without_losing_records(
    broker, topic_factory, worker_factory
):
    env = env_for(topic_factory)
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    keys = [f"k{i}" for i in range(40)]  # all different: only the limit bounds concurrency
    produce(broker.bootstrap, env["AS_INPUT"], [(k, {"n": 0}) for k in keys])
    worker = worker_factory("tests.apps.ordering:app", env, extra_args=["--max-in-flight", "3"])
    records = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 40, timeout=90)
    assert {r.json()["key"] for r in records} == set(keys)
    assert worker.terminate() == 0
    assert "peak_in_flight=3," in worker.log(), worker.log()
