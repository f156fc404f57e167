"""``durable_agent(concurrency=N)`` through a real Faust worker: records of distinct keys
run at the same time (eight records whose calls each wait for all eight to be running
finish; one at a time, the first would give up at the barrier and go to the dead
letters), a key's records still run in order (its memory lists them in offset order), and
every call runs once."""

from __future__ import annotations

import pytest

from agents_stream.testing.topics import create_topics, produce, wait_for_records

pytest.importorskip("faust")

pytestmark = [pytest.mark.broker]

PARTIES = 8


def test_distinct_keys_run_concurrently_and_each_key_in_order(
    broker, topic_factory, faust_factory, tmp_path
):
    env = {
        "AS_BROKER": broker.url,
        "AS_DATA_DIR": str(tmp_path / "data"),
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_CONCURRENCY": "16",
        "AS_PARTIES": str(PARTIES),
        "AS_WAIT_S": "60",
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    together = [(f"k{i}", {"n": i, "barrier": True}) for i in range(PARTIES)]
    in_order = [("same", {"n": n}) for n in range(5)]
    produce(broker.bootstrap, env["AS_INPUT"], together + in_order)
    proc = faust_factory("tests.faust.slow_app", env)
    outputs = wait_for_records(
        broker.bootstrap, env["AS_OUTPUT"], PARTIES + len(in_order), timeout=120
    )
    by_key: dict[str, list[list[int]]] = {}
    for record in outputs:
        value = record.json()
        by_key.setdefault(record.key, []).append(value["seen"])
    assert {k: v for k, v in by_key.items() if k != "same"} == {
        f"k{i}": [[i]] for i in range(PARTIES)
    }
    # One key's records ran one after another, in offset order: each saw all before it.
    assert sorted(by_key["same"], key=len) == [list(range(n + 1)) for n in range(5)]
    assert proc.terminate() == 0
    assert "'dlq': 0" in proc.log() and "'calls_executed': 13" in proc.log(), proc.log()
