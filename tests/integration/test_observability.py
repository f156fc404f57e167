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
    assert sample(text, "agents_stream_assigned_partitions", topic=env["AS_INPUT"]) == 2
    lags = [sample(text, "agents_stream_consumer_lag", topic=env["AS_INPUT"], partition=str(p))
            for p in range(2)]  # fmt: skip
    assert all(lag is not None and lag >= 0 for lag in lags), text

    assert worker.terminate() == 0
    lines = [line for line in worker.log().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]
    assert all({"ts", "level", "logger", "message"} <= set(p) for p in parsed)
    assert any(p["message"].startswith("stopped") for p in parsed)


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
