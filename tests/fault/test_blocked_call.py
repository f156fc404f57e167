"""Exactly-once: a transactional call that never returns does not hang the worker.

On a cluster, a controlled shutdown of the broker holding the group coordinator left
``send_offsets_to_transaction(..., 30.0)`` blocked for over five minutes (librdkafka
2.12.1, confluentinc/librdkafka#5456): the worker's Kafka thread sat in it, nothing
committed, nothing logged (issue 50). Waiting for the broker sequence that triggers it is
not reliable, so the worker blocks itself at the same call
(``AGENTS_STREAM_TEST_BLOCK_IN_TRANSACTION=send offsets``): the offsets are sent, then the
call never returns, as librdkafka's did.

Asserted: the worker gives up on the call at its own deadline (one WARNING naming it),
counts it, replaces the transactional producer (which fences the stuck transaction),
takes its partitions again and finishes every input: 0 lost, 0 duplicates read
``read_committed``, 0 acknowledged calls run again, the same process throughout, no
CRITICAL line. Apache Kafka only.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from agents_stream.testing.topics import create_topics, produce, read_topic
from tests.apps.effects import REEXECUTED_AFTER_ACK, connect
from tests.fault.fleet import assert_survivors
from tests.integration.test_observability import free_port, get, sample

pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.kafka_only]

INPUTS = 300


@pytest.mark.timeout(300)
@pytest.mark.parametrize("step", ["send offsets", "commit"])
def test_a_transactional_call_that_never_returns(
    step, broker, topic_factory, worker_factory, tmp_path, capsys
):
    db_path = tmp_path / "effects.sqlite"
    connect(str(db_path)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db_path),
        "AS_COMMIT_INTERVAL": "0.3",
        "AGENTS_STREAM_TEST_BLOCK_IN_TRANSACTION": step,
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=2)
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [(f"key-{n % 8}", {"scenario": "calls", "n": n, "delay": 0.02}) for n in range(INPUTS)],
    )
    port = free_port()
    worker = worker_factory(
        "tests.apps.crashy:app",
        env,
        extra_args=["--processing-guarantee", "exactly-once", "--metrics-port", str(port)],
    )
    assert worker.proc is not None
    pid = worker.proc.pid
    began = time.monotonic()
    deadline = began + 180
    outputs: list = []
    while time.monotonic() < deadline:
        assert worker.alive, worker.log()[-4000:]
        outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
        if len({r.json()["n"] for r in outputs}) >= INPUTS:
            break
        time.sleep(1.0)
    took = time.monotonic() - began
    time.sleep(2.0)  # a late duplicate would show up here
    outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
    metrics = get(port, "/metrics")[1]
    blocked = sample(metrics, "agents_stream_kafka_calls_blocked_total")
    replaced = sample(metrics, "agents_stream_transactional_producers_replaced_total")
    dead_letters = sample(metrics, "agents_stream_dead_letters_total")
    ready = get(port, "/readyz")[0]
    log = worker.log()
    assert_survivors([worker])
    assert worker.proc.pid == pid
    worker.terminate()

    per_input = Counter(r.json()["n"] for r in outputs)
    lost = INPUTS - len(per_input)
    duplicates = sum(c - 1 for c in per_input.values())
    db = connect(str(db_path))
    (reexecuted_acked,) = db.execute(REEXECUTED_AFTER_ACK).fetchone()
    db.close()
    with capsys.disabled():
        print(
            f"\nblocked {step}: all {INPUTS} inputs out after {took:.1f}s; calls given up at "
            f"the deadline={blocked}, producers replaced={replaced}; lost={lost}, duplicates "
            f"read_committed={duplicates}, acked calls re-executed={reexecuted_acked}"
        )
    assert "blocking in the transaction" in log, log[-4000:]
    assert f"transaction {step} has blocked for" in log, log[-4000:]
    assert blocked == 1 and replaced >= 1, metrics
    assert ready == 200  # recovered: ready again
    # The aborted transaction's sends are abandoned work, run again: never dead letters.
    assert dead_letters == 0, log[-4000:]
    assert lost == 0, log[-4000:]
    assert duplicates == 0, log[-4000:]
    assert reexecuted_acked == 0
