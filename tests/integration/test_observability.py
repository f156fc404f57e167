"""worker --metrics-port / --log-format json against the real broker."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from agents_stream.testing.topics import create_topics, produce, wait_for_records

pytestmark = pytest.mark.broker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in the Prometheus text format."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # exposition order
    series = f"{name}{{{want}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_readiness_and_json_logs(broker, topic_factory, worker_factory):
    env = {"AS_APP_ID": topic_factory("app"), "AS_INPUT": topic_factory("in"),
           "AS_OUTPUT": topic_factory("out")}  # fmt: skip
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    port = free_port()
    worker = worker_factory(
        "tests.apps.ops_app:app",
        env,
        extra_args=["--metrics-port", str(port), "--log-format", "json"],
    )
    statuses = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status, _ = get(port, "/readyz")
        except OSError:  # not listening yet
            time.sleep(0.05)
            continue
        statuses.append(status)
        if status == 200:
            break
        time.sleep(0.05)
    assert statuses and statuses[0] == 503, (statuses, worker.log())
    assert statuses[-1] == 200, worker.log()
    assert get(port, "/healthz")[0] == 200

    n = 37
    produce(broker.bootstrap, env["AS_INPUT"], [(f"k{i % 5}", {"i": i}) for i in range(n)])
    assert len(wait_for_records(broker.bootstrap, env["AS_OUTPUT"], n, timeout=60)) == n
    deadline = time.monotonic() + 30
    while True:  # records finish after their outputs are acked
        status, text = get(port, "/metrics")
        if sample(text, "agents_stream_records_total") == n or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200
    assert sample(text, "agents_stream_records_total") == n, text
    labels = {"agent": "Echo", "topic": env["AS_INPUT"]}
    assert sample(text, "agents_stream_agent_records_in_total", **labels) == n
    assert sample(text, "agents_stream_agent_records_out_total", **labels) == n
    assert sample(text, "agents_stream_journal_ack_seconds_count") > 0
    assert sample(text, "agents_stream_ready") == 1
    # A broker that answers: nothing waits on it (test_cluster.py: below min ISR).
    assert sample(text, "agents_stream_journal_stalled") == 0
    assert sample(text, "agents_stream_broker_silences_total") == 0
    unanswered = sample(text, "agents_stream_journal_unanswered_seconds")
    assert unanswered is not None and unanswered < 60, text
    assert sample(text, "agents_stream_assigned_partitions", topic=env["AS_INPUT"]) == 2
    lags = [sample(text, "agents_stream_consumer_lag", topic=env["AS_INPUT"], partition=str(p))
            for p in range(2)]  # fmt: skip
    assert all(lag is not None and lag >= 0 for lag in lags), text

    assert worker.terminate() == 0
    lines = [line for line in worker.log().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]
    assert all({"ts", "level", "logger", "message"} <= set(p) for p in parsed)
    assert any(p["message"].startswith("stopped") for p in parsed)

    # The next worker of the group gets no record in its run: its gauges still show
    # each partition's committed offset and its lag (0), from the assignment on.
    port = free_port()
    again = worker_factory("tests.apps.ops_app:app", env, extra_args=["--metrics-port", str(port)])
    deadline = time.monotonic() + 60
    committed: list[float | None] = []
    while time.monotonic() < deadline:
        try:
            status, text = get(port, "/metrics")
        except OSError:  # not listening yet
            time.sleep(0.1)
            continue
        committed = [
            sample(text, "agents_stream_committed_offset", topic=env["AS_INPUT"], partition=str(p))
            for p in range(2)
        ]
        if all(c is not None for c in committed):
            break
        time.sleep(0.2)
    assert all(c is not None for c in committed) and sum(committed) == n, (text, again.log())
    assert again.terminate() == 0


def test_metrics_port_in_use_fails_fast(broker, topic_factory, worker_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"AS_APP_ID": topic_factory("app"), "AS_INPUT": topic_factory("in")}
        worker = worker_factory(
            "tests.apps.ops_app:app", env, extra_args=["--metrics-port", str(port)]
        )
        assert worker.proc.wait(30) == 1
    last = worker.log().strip().splitlines()[-1]
    assert "cannot serve metrics" in last and "--metrics-port" in last, last


def test_lag_counts_records_fetched_but_not_finished(broker, topic_factory, worker_factory):
    """40 records whose calls wait at a barrier that never fills: nothing finishes, so
    nothing is committed. The lag an alert watches is 40 (it read 0 when it was the
    fetch lag: every record was fetched), and records_unfinished says where they are.
    Once the barrier gives up (the records are dead-lettered, finished) it falls to 0."""
    env = {"AS_APP_ID": topic_factory("app"), "AS_INPUT": topic_factory("in"),
           "AS_OUTPUT": topic_factory("out"), "AS_PARTIES": "1000", "AS_WAIT_S": "8"}  # fmt: skip
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    port = free_port()
    worker = worker_factory(
        "tests.apps.slow_calls_app:app", env, extra_args=["--metrics-port", str(port)]
    )
    n = 40
    produce(broker.bootstrap, env["AS_INPUT"], [(f"k{i}", {"i": i}) for i in range(n)])

    def total(text: str, name: str) -> float:
        values = [sample(text, name, topic=env["AS_INPUT"], partition=str(p)) for p in range(2)]
        return sum(v or 0 for v in values)

    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            _, text = get(port, "/metrics")
        except OSError:
            time.sleep(0.2)
            continue
        seen.append((total(text, "agents_stream_consumer_lag"),
                     total(text, "agents_stream_records_unfinished")))  # fmt: skip
        if seen[-1] == (n, n):
            break
        time.sleep(0.2)
    assert seen and seen[-1] == (n, n), (seen[-5:], worker.log()[-2000:])
    assert total(text, "agents_stream_fetch_lag") == 0  # what the old gauge showed
    wait_for_records(broker.bootstrap, f"{env['AS_INPUT']}-dlq", n, timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, text = get(port, "/metrics")
        if total(text, "agents_stream_consumer_lag") == 0:
            break
        time.sleep(0.3)
    assert total(text, "agents_stream_consumer_lag") == 0, text
    assert total(text, "agents_stream_records_unfinished") == 0
    assert worker.terminate() == 0


def test_tombstones_are_counted_and_said_once_per_partition(broker, topic_factory, worker_factory):
    env = {"AS_APP_ID": topic_factory("app"), "AS_INPUT": topic_factory("in"),
           "AS_OUTPUT": topic_factory("out")}  # fmt: skip
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=1)
    port = free_port()
    worker = worker_factory("tests.apps.ops_app:app", env, extra_args=["--metrics-port", str(port)])
    produce(
        broker.bootstrap, env["AS_INPUT"], [("k", None), ("k", None), ("k", b'{"i": 1}')], raw=True
    )
    wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 1, timeout=60)
    labels = {"agent": "Echo", "topic": env["AS_INPUT"]}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, text = get(port, "/metrics")
        if sample(text, "agents_stream_agent_tombstones_total", **labels) == 2:
            break
        time.sleep(0.2)
    assert sample(text, "agents_stream_agent_tombstones_total", **labels) == 2, text
    log = worker.log()
    assert log.count("a tombstone (null value") == 1, log
    assert worker.terminate() == 0
