"""The crash window, bounded: how many calls a SIGKILL makes run twice.

A call runs again after a crash only if it had started and its outcome was not yet
acknowledged: running on a code-block thread, or returned and waiting for the journal's
ack. A sync action has one such call at a time, so a killed worker leaves at most
``--max-in-flight`` of them (records admitted), of which at most ``--code-block-threads``
are running. Two workers on 4 partitions drain 2,000 inputs (distinct keys: every slot
busy) x 2 journaled calls of 50 ms with 32 threads and 256 records in flight each; one
is SIGKILLed mid-run. Asserted: nothing lost, no acknowledged call run twice, calls run
twice <= 256; ``agents_stream_calls_in_flight`` read just before the kill is printed
beside the count (docs/operations.md quotes both).
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter

import pytest

from agents_stream.testing.topics import create_topics, produce, read_topic
from tests.fault.fleet import assert_survivors
from tests.fault.scenario import wait_log
from tests.integration.test_observability import free_port, get, sample

pytestmark = [pytest.mark.broker, pytest.mark.fault]

PARTITIONS = 4
INPUTS = 2000
THREADS = 32
IN_FLIGHT = 256


@pytest.mark.kafka_proof
def test_sigkill_runs_at_most_the_records_in_flight_calls_twice(
    broker, topic_factory, worker_factory, tmp_path, capsys
):
    ledger = tmp_path / "ledger.sqlite"
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_LEDGER": str(ledger),
        "AS_COMMIT_INTERVAL": "0.3",
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"], env["AS_OUTPUT"]], partitions=PARTITIONS)
    app = "tests.apps.zombie_app:app"
    port = free_port()
    args = ["--code-block-threads", str(THREADS), "--max-in-flight", str(IN_FLIGHT)]
    victim = worker_factory(
        app, env, extra_args=[*args, "--metrics-port", str(port), "--data-dir", str(tmp_path / "a")]
    )
    wait_log(victim, "assigned", timeout=90)
    other = worker_factory(app, env, extra_args=[*args, "--data-dir", str(tmp_path / "b")])
    wait_log(other, "assigned", timeout=90)
    wait_log(victim, "revoked", timeout=90)
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [(f"k{n}", {"n": n}) for n in range(INPUTS)],
    )
    db = sqlite3.connect(str(ledger), timeout=60)
    assert victim.proc is not None
    vpid = victim.proc.pid
    in_flight: float | None = None
    deadline = time.monotonic() + 90
    while True:
        assert time.monotonic() < deadline, victim.log()[-3000:]
        try:
            (started,) = db.execute(
                "SELECT count(*) FROM calls WHERE what='start' AND pid=?", (vpid,)
            ).fetchone()
        except sqlite3.OperationalError:  # no call yet: no table
            started = 0
        if started >= 300:
            in_flight = sample(get(port, "/metrics")[1], "agents_stream_calls_in_flight")
            victim.kill()
            break
        time.sleep(0.02)

    deadline = time.monotonic() + 180
    while True:
        per_input = Counter(o.json()["n"] for o in read_topic(broker.bootstrap, env["AS_OUTPUT"]))
        if len(per_input) >= INPUTS or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert_survivors([other])  # not killed: running, no CRITICAL line
    other.terminate()
    rows = db.execute("SELECT id, what, n, i FROM calls ORDER BY id").fetchall()
    db.close()
    runs = Counter((n, i) for _, what, n, i in rows if what == "start")
    acked = {(n, i): id_ for id_, what, n, i in reversed(rows) if what == "acked"}
    rerun_acked = [
        (n, i) for id_, what, n, i in rows if what == "start" and id_ > acked.get((n, i), 1 << 62)
    ]
    twice = sum(1 for c in runs.values() if c > 1)
    lost = sorted(set(range(INPUTS)) - set(per_input))
    with capsys.disabled():
        print(
            f"\ncrash window: {INPUTS} inputs x 2 calls of 50 ms, {THREADS} code-block "
            f"threads, {IN_FLIGHT} records in flight; calls_in_flight just before the SIGKILL: {in_flight}; calls run twice: "
            f"{twice} (acknowledged ones: {len(rerun_acked)}); duplicate outputs: "
            f"{sum(c - 1 for c in per_input.values())}; lost: {len(lost)}"
        )
    assert not lost, lost[:20]
    assert not rerun_acked, rerun_acked[:20]
    assert twice <= IN_FLIGHT
