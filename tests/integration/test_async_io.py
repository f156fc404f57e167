"""``app.async_io`` on the worker against the real broker: order, timeouts, retries, crash."""

from __future__ import annotations

import collections
import time

import pytest

from agents_stream.durable.output_identity import OUTPUT_HEADER
from agents_stream.testing.topics import (
    Record,
    create_topics,
    produce,
    read_topic,
    wait_for_records,
)

pytestmark = pytest.mark.broker

APP = "tests.apps.aio_app:app"


def env_for(topic_factory, **settings: str) -> dict[str, str]:
    return {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        **settings,
    }


def input_positions(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Input id ``i`` -> (partition, offset) where it was written."""
    return {r.json()["i"]: (r.partition, r.offset) for r in read_topic(bootstrap, topic)}


def wait_for_log(worker, text: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in worker.log():
        assert worker.alive and time.monotonic() < deadline, worker.log()
        time.sleep(0.05)


def dlq_by_id(records: list[Record]) -> dict[int, dict[str, str]]:
    return {r.json()["i"]: {k: v.decode() for k, v in r.headers.items()} for r in records}


def test_ordered_outputs_keep_input_order_per_partition(broker, topic_factory, worker_factory):
    env = env_for(topic_factory, AS_ORDERED="1", AS_MAX_LATENCY="0.1", AS_CAPACITY="25")
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=3)
    keys = [f"user-{k}" for k in range(12)]
    values = [(keys[i % 12], {"key": keys[i % 12], "i": i}) for i in range(300)]
    produce(broker.bootstrap, env["AS_INPUT"], values)
    worker = worker_factory(APP, env)

    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 300, timeout=60)
    assert len(outputs) == 300, worker.log()
    assert sorted(r.json()["i"] for r in outputs) == list(range(300))  # no loss, no dups
    assert all(r.key == r.json()["key"] and r.json()["enriched"] for r in outputs)
    head = f"{env['AS_APP_ID']}/{env['AS_INPUT']}/".encode()
    assert all(r.headers[OUTPUT_HEADER].startswith(head) for r in outputs)
    # Random latencies reorder completions; the output must not show it: within each
    # output partition, the records of one input partition appear in offset order.
    position = input_positions(broker.bootstrap, env["AS_INPUT"])
    for out_partition in {r.partition for r in outputs}:
        seen: dict[int, list[int]] = collections.defaultdict(list)
        for r in sorted(outputs, key=lambda r: r.offset):
            if r.partition == out_partition:
                in_partition, in_offset = position[r.json()["i"]]
                seen[in_partition].append(in_offset)
        for in_partition, offsets in seen.items():
            assert offsets == sorted(offsets), (out_partition, in_partition)
    assert worker.terminate() == 0, worker.log()


@pytest.mark.parametrize("time_mode", ["processing", "event"])
def test_unordered_emits_everything_as_completed(broker, topic_factory, worker_factory, time_mode):
    env = env_for(topic_factory, AS_ORDERED="0", AS_TIME_MODE=time_mode, AS_CAPACITY="30")
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=1)
    # The first record is slow; everything after it is quick.
    values = [("k", {"key": "k", "i": 0, "sleep": 1.5})]
    values += [("k", {"key": "k", "i": i}) for i in range(1, 100)]
    produce(broker.bootstrap, env["AS_INPUT"], values)
    worker = worker_factory(APP, env)

    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 100, timeout=60)
    ids = [r.json()["i"] for r in sorted(outputs, key=lambda r: r.offset)]
    assert sorted(ids) == list(range(100)), worker.log()
    if time_mode == "processing":
        assert ids[0] != 0  # quick ones overtook the slow one
    else:
        # Event time: the watermark queued right behind record 0 (the first watermark)
        # is a barrier nothing after it may cross.
        assert ids[0] == 0


def test_timeouts_and_failures_go_to_dlq(broker, topic_factory, worker_factory):
    env = env_for(topic_factory, AS_TIMEOUT="0.5")
    inp = env["AS_INPUT"]
    create_topics(broker.bootstrap, [inp], partitions=2)
    produce(broker.bootstrap, inp, [("a", b"{not json")], raw=True)
    produce(
        broker.bootstrap,
        inp,
        [
            ("a", {"key": "a", "i": 0, "sleep": 5}),
            ("a", {"key": "a", "i": 1}),
            ("b", {"key": "b", "i": 2, "fail": True}),
            ("b", {"key": "b", "i": 3}),
        ],
    )
    worker = worker_factory(APP, env)

    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 2, timeout=60)
    dlq = wait_for_records(broker.bootstrap, f"{inp}-dlq", 3, timeout=30)
    assert sorted(r.json()["i"] for r in outputs) == [1, 3]
    decode = [r for r in dlq if r.headers["x-error-stage"] == b"decode"]
    assert [r.value for r in decode] == [b"{not json"]
    failed = dlq_by_id([r for r in dlq if r.headers["x-error-stage"] != b"decode"])
    assert failed[0]["x-error-stage"] == "async_io"
    assert failed[0]["x-error-type"].endswith("AsyncIOTimeout")
    assert failed[0]["x-source-topic"] == inp
    assert failed[2]["x-error-stage"] == "async_io"
    assert failed[2]["x-error-type"] == "builtins.ValueError"
    # dead-lettered records are finished: a graceful stop commits past them
    assert worker.terminate() == 0, worker.log()


def test_on_timeout_supplies_a_result_instead_of_a_dead_letter(
    broker, topic_factory, worker_factory
):
    env = env_for(topic_factory, AS_TIMEOUT="0.5", AS_ON_TIMEOUT="1")
    inp = env["AS_INPUT"]
    create_topics(broker.bootstrap, [inp], partitions=1)
    produce(broker.bootstrap, inp, [("a", {"key": "a", "i": 0, "sleep": 5})])
    produce(broker.bootstrap, inp, [("a", {"key": "a", "i": 1})])
    worker = worker_factory(APP, env)

    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 2, timeout=60)
    by_id = {r.json()["i"]: r.json() for r in outputs}
    assert by_id[0]["timed_out"] is True and by_id[0]["enriched"] is False
    assert by_id[1]["enriched"] is True
    # ordered: the fallback result still comes first
    assert [r.json()["i"] for r in sorted(outputs, key=lambda r: r.offset)] == [0, 1]
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
    assert worker.terminate() == 0, worker.log()


def test_retry_on_exception_succeeds_and_exhausted_retries_dead_letter(
    broker, topic_factory, worker_factory
):
    env = env_for(topic_factory, AS_RETRIES="3")
    inp = env["AS_INPUT"]
    create_topics(broker.bootstrap, [inp], partitions=1)
    produce(
        broker.bootstrap,
        inp,
        [
            ("a", {"key": "a", "i": 0, "fail_times": 2}),  # 3rd attempt succeeds
            ("a", {"key": "a", "i": 1}),
            ("a", {"key": "a", "i": 2, "fail_times": 9}),  # 1 + 3 retries all fail
        ],
    )
    worker = worker_factory(APP, env)

    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 2, timeout=60)
    dlq = wait_for_records(broker.bootstrap, f"{inp}-dlq", 1, timeout=30)
    assert {r.json()["i"]: r.json()["attempt"] for r in outputs} == {0: 3, 1: 1}
    [dead] = dlq
    assert dead.json()["i"] == 2
    assert dead.headers["x-error-type"] == b"builtins.ConnectionError"
    assert b"transient failure 4 of a/2" in dead.headers["x-error-message"]
    assert worker.terminate() == 0, worker.log()


@pytest.mark.kafka_proof
@pytest.mark.fault
def test_sigkill_with_calls_in_flight_loses_nothing(broker, topic_factory, worker_factory):
    n = 400
    env = env_for(topic_factory, AS_MAX_LATENCY="0.4", AS_CAPACITY="40")
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=3)
    keys = [f"k{k}" for k in range(9)]
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [(keys[i % 9], {"key": keys[i % 9], "i": i}) for i in range(n)],
    )
    first = worker_factory(APP, env)
    wait_for_log(first, "assigned", timeout=30)
    # ~100 outputs/s once fetching: kill when a fraction is done, 40 calls in flight (a
    # fixed delay after the assignment raced a slow first fetch on a loaded machine).
    deadline = time.monotonic() + 30
    while len(read_topic(broker.bootstrap, env["AS_OUTPUT"])) < 20:
        assert first.alive and time.monotonic() < deadline, first.log()
        time.sleep(0.1)
    first.kill()
    before_crash = len(read_topic(broker.bootstrap, env["AS_OUTPUT"]))
    assert 0 < before_crash < n, f"{before_crash} outputs: crash not mid-stream\n{first.log()}"

    second = worker_factory(APP, env)
    deadline = time.monotonic() + 60
    outputs: list[Record] = []
    while time.monotonic() < deadline:
        outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
        if {r.json()["i"] for r in outputs} >= set(range(n)):
            break
        time.sleep(0.3)
    counts = collections.Counter(r.json()["i"] for r in outputs)
    missing = set(range(n)) - set(counts)
    assert not missing, (sorted(missing)[:20], second.log())
    duplicates = {i: c for i, c in counts.items() if c > 1}
    pids = collections.Counter(r.json()["pid"] for r in outputs)
    # At-least-once: inputs whose outputs were acked but whose offsets were not yet
    # committed when the worker died are re-invoked by the second worker.
    print(
        f"\nasync_io crash: {n} inputs, {before_crash} outputs before SIGKILL, "
        f"{len(outputs)} outputs total, {len(duplicates)} duplicated inputs, by pid {dict(pids)}"
    )
    assert set(pids) == {first.proc.pid, second.proc.pid}
    assert len(duplicates) <= before_crash  # only what the first worker wrote can repeat
    # A re-run's output carries the identity of the first run's: consumers dedupe on it.
    identity = {r.headers[OUTPUT_HEADER]: r.json()["i"] for r in outputs}
    assert sorted(identity.values()) == list(range(n))
    assert second.terminate() == 0, second.log()
