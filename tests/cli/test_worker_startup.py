"""``agents-stream worker`` fails fast: one line naming the fix, a non-zero exit, a bounded
time; SIGTERM stops it at any stage of startup. Real subprocesses, the real broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents_stream.kafka.admin import TopicAdmin, TopicSpec, compacted

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1: connection refused at once


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTS_STREAM_")}
    env.update(extra)
    return env


def _cmd(app: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "agents_stream", "worker", "-A", app, *args]


def _run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def _assert_one_line(output: str, *phrases: str, alone: bool = True) -> str:
    """The output ends in one CRITICAL line holding ``phrases``; with ``alone`` (nothing
    reached a broker) it is the only line."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "no output"
    assert not alone or len(lines) == 1, output
    assert "Traceback" not in output, output
    assert sum("CRITICAL" in line for line in lines) == 1, output
    last = lines[-1]
    assert "CRITICAL" in last, output
    for phrase in phrases:
        assert phrase in last, last
    return last


def test_app_module_typo(tmp_path: Path) -> None:
    rc, out, took = _run(_cmd("tests.apps.ops_ap", "-b", UNREACHABLE), _env())
    assert rc == 1
    _assert_one_line(out, "cannot import app module 'tests.apps.ops_ap'", "fix -A")
    assert took < 10


def test_app_attribute_typo(tmp_path: Path) -> None:
    rc, out, _ = _run(_cmd("tests.apps.ops_app:ap", "-b", UNREACHABLE), _env())
    assert rc == 1
    _assert_one_line(out, "has no attribute 'ap'", "its Apps: app", "fix -A")


def test_no_broker_configured(tmp_path: Path) -> None:
    rc, out, took = _run(_cmd("tests.apps.ops_app"), _env())
    assert rc == 1
    _assert_one_line(
        out,
        "no broker configured: pass --broker, set AGENTS_STREAM_BROKER, or App(broker=...); "
        "--broker embedded for a local in-memory broker",
    )
    assert took < 10


@pytest.mark.parametrize(
    "topic, problem",
    [("orders in", "contains ' '"), ("x" * 250, "250 characters"), ("a/b", "contains '/'")],
)
def test_invalid_topic_names_fail_before_the_broker(topic: str, problem: str) -> None:
    # An unreachable broker would take the startup timeout: a fast exit proves the name
    # was checked first.
    rc, out, took = _run(_cmd("tests.apps.ops_app", "-b", UNREACHABLE), _env(AS_INPUT=topic))
    assert rc == 1
    _assert_one_line(out, "invalid topic name", problem, "rename it")
    assert took < 5


def test_a_malformed_gil_switch_interval_fails_before_the_broker() -> None:
    env = _env(AGENTS_STREAM_GIL_SWITCH_US="fast")
    rc, out, _ = _run(_cmd("tests.apps.ops_app", "-b", UNREACHABLE), env)
    assert rc == 1
    _assert_one_line(out, "AGENTS_STREAM_GIL_SWITCH_US='fast'", "microseconds")


def test_unreachable_broker_is_bounded_and_quiet() -> None:
    cmd = _cmd("tests.apps.ops_app", "-b", UNREACHABLE, "--startup-timeout", "3")
    rc, out, took = _run(cmd, _env())
    assert rc == 1
    _assert_one_line(
        out, f"cannot reach the Kafka cluster at {UNREACHABLE} within 3s", "--broker", alone=False
    )
    assert took < 8
    # librdkafka's own lines come through Python logging, each message once.
    lines = out.splitlines()
    assert not any(line.startswith("%") for line in lines), out
    assert len(lines) <= 3, out


def test_unreachable_broker_default_bound() -> None:
    rc, out, took = _run(_cmd("tests.apps.ops_app", "-b", UNREACHABLE), _env())
    assert rc == 1
    _assert_one_line(out, "within 10s", alone=False)
    assert took < 15


def _terminate_after(cmd: list[str], env: dict[str, str], marker: str | None, delay: float):
    """Start the worker, SIGTERM it once ``marker`` was logged (or after ``delay``);
    returns (exit code, output, seconds from signal to exit)."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    output: list[str] = []
    if marker is not None:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            output.append(line)
            if marker in line or time.monotonic() > deadline:
                break
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    try:
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, "".join(output) + rest, time.monotonic() - sent


def test_sigterm_while_waiting_for_the_broker() -> None:
    rc, out, took = _terminate_after(
        _cmd("tests.apps.ops_app", "-b", UNREACHABLE), _env(), None, 2.0
    )
    assert rc == 0, out
    assert took < 2, out
    assert "stopped during startup" in out


@pytest.mark.broker
def test_sigterm_while_joining_the_group(broker, topic_factory, tmp_path: Path) -> None:
    env = _env(AS_APP_ID=topic_factory("app"), AS_INPUT=topic_factory("in"))
    cmd = _cmd("tests.apps.ops_app", "-b", broker.url, "--data-dir", str(tmp_path))
    # The group join takes seconds (session timeout); stop in the middle of it.
    rc, out, took = _terminate_after(cmd, env, "worker ", 0.2)
    assert rc == 0, out
    assert took < 10, out
    assert "stopped" in out.splitlines()[-1], out


@pytest.mark.broker
def test_action_state_with_fewer_partitions(broker, topic_factory, tmp_path: Path) -> None:
    app_id, topic = topic_factory("app"), topic_factory("in")
    TopicAdmin(broker.bootstrap).ensure(
        [TopicSpec(topic, 4), compacted(f"{app_id}-action-state", 2)]
    )
    env = _env(AS_APP_ID=app_id, AS_INPUT=topic)
    rc, out, took = _run(
        _cmd("tests.apps.ops_app", "-b", broker.url, "--data-dir", str(tmp_path)), env
    )
    assert rc == 1
    _assert_one_line(
        out,
        f"ActionState topic {app_id}-action-state has 2 partitions",
        f"{topic} has 4",
        "at least 4",
        alone=False,
    )
    assert took < 15


@pytest.mark.broker
def test_action_state_not_compacted(broker, topic_factory, tmp_path: Path) -> None:
    app_id, topic = topic_factory("app"), topic_factory("in")
    TopicAdmin(broker.bootstrap).ensure(
        [TopicSpec(topic, 2), TopicSpec(f"{app_id}-action-state", 2, {"cleanup.policy": "delete"})]
    )
    env = _env(AS_APP_ID=app_id, AS_INPUT=topic)
    rc, out, took = _run(
        _cmd("tests.apps.ops_app", "-b", broker.url, "--data-dir", str(tmp_path)), env
    )
    assert rc == 1
    _assert_one_line(out, "cleanup.policy=delete", "set cleanup.policy=compact", alone=False)
    assert took < 15


@pytest.mark.broker
def test_exactly_once_is_refused_on_the_embedded_broker(
    broker, topic_factory, tmp_path: Path
) -> None:
    """Its read_committed readers see aborted records: exactly-once would be a promise
    the broker cannot keep. On Apache Kafka the same command starts."""
    env = _env(AS_APP_ID=topic_factory("app"), AS_INPUT=topic_factory("in"))
    cmd = _cmd(
        "tests.apps.ops_app", "-b", broker.url, "--data-dir", str(tmp_path),
        "--processing-guarantee", "exactly-once",
    )  # fmt: skip
    if getattr(broker, "kind", "embedded") == "kafka":
        rc, out, _ = _terminate_after(cmd, env, "assigned", 0.0)
        assert rc == 0, out
        return
    rc, out, took = _run(cmd, env)
    assert rc == 1, out
    _assert_one_line(out, "exactly_once needs Apache Kafka", "at-least-once", alone=False)
    assert took < 15


@pytest.mark.broker
def test_embedded_broker_is_opt_in(tmp_path: Path) -> None:
    cmd = _cmd("tests.apps.ops_app", "--broker", "embedded", "--data-dir", str(tmp_path))
    rc, out, took = _terminate_after(cmd, _env(), "assigned", 0.0)
    assert rc == 0, out
    assert "embedded in-memory broker" in out
    assert took < 10, out


@pytest.mark.broker
def test_kafka_config_reaches_every_client_and_secrets_stay_out(
    broker, topic_factory, tmp_path: Path
) -> None:
    secret_file, secret_env = "file-secret-5e1f0a", "env-secret-93c2d7"
    props = tmp_path / "client.properties"
    props.write_text(
        "# every client of the worker gets these\n"
        "client.id=ops-probe-4711\n"
        "security.protocol=PLAINTEXT\n"
        f"sasl.password={secret_file}\n"
    )
    env = _env(
        AS_APP_ID=topic_factory("app"),
        AS_INPUT=topic_factory("in"),
        AGENTS_STREAM_KAFKA_SSL_KEY_PASSWORD=secret_env,
    )
    cmd = _cmd(
        "tests.apps.ops_app", "-b", broker.url, "--data-dir", str(tmp_path / "data"),
        "--kafka-config", str(props), "-l", "debug",
    )  # fmt: skip
    rc, out, _ = _terminate_after(cmd, env, "assigned", 0.0)
    assert rc == 0, out[-3000:]
    for kind in ("admin", "producer", "consumer", "reader"):
        lines = [line for line in out.splitlines() if f"{kind} client config" in line]
        assert lines, f"no {kind} client built:\n{out[-3000:]}"
        assert all("'client.id': 'ops-probe-4711'" in line for line in lines), lines
        assert all("'ssl.key.password': '[redacted]'" in line for line in lines), lines
    assert secret_file not in out and secret_env not in out

    help_text = subprocess.run(
        [sys.executable, "-m", "agents_stream", "worker", "--help"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "--kafka-config" in help_text and secret_env not in help_text


def test_invalid_replication_options_fail_before_the_broker() -> None:
    cmd = _cmd("tests.apps.ops_app", "-b", UNREACHABLE, "--replication-factor", "2",
               "--min-insync-replicas", "3")  # fmt: skip
    rc, out, took = _run(cmd, _env())
    assert rc == 1
    _assert_one_line(out, "min.insync.replicas 3 is invalid for replication factor 2")
    assert took < 5


@pytest.mark.broker
def test_replication_options_reach_created_topics(broker, topic_factory, tmp_path: Path) -> None:
    app_id, topic = topic_factory("app"), topic_factory("in")
    env = _env(AS_APP_ID=app_id, AS_INPUT=topic)
    cmd = _cmd(
        "tests.apps.ops_app", "-b", broker.url, "--data-dir", str(tmp_path),
        "--replication-factor", "1", "--min-insync-replicas", "1",
    )  # fmt: skip
    rc, out, _ = _terminate_after(cmd, env, "worker ", 0.0)
    assert rc == 0, out
    admin = TopicAdmin(broker.bootstrap)
    state = admin.topic_config(f"{app_id}-action-state")
    assert state.get("min.insync.replicas") == "1"
    assert "compact" in state.get("cleanup.policy", "")
    md = admin.client.list_topics(timeout=10)
    assert all(len(p.replicas) == 1 for p in md.topics[topic].partitions.values())


def test_rejected_client_configuration(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("bogus.property=1\nsasl.password=never-printed-77\n")
    cmd = _cmd("tests.apps.ops_app", "-b", UNREACHABLE, "--kafka-config", str(props))
    rc, out, took = _run(cmd, _env())
    assert rc == 1
    _assert_one_line(
        out, "Kafka client configuration rejected", '"bogus.property"', "--kafka-config"
    )
    assert "never-printed-77" not in out
    assert took < 5


def test_cli_does_not_import_test_helpers() -> None:
    code = (
        "import sys\n"
        "from agents_stream.cli.main import build_parser\n"
        "from agents_stream.cli import worker\n"
        "build_parser()\n"
        "import agents_stream.runtime.embedded\n"
        "assert not [m for m in sys.modules if m.startswith('agents_stream.testing')], sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_processes_fail_fast_on_an_unreachable_broker() -> None:
    # Every child fails during startup: the command stops them all and ends with one
    # line naming the fix, the children's reason included.
    cmd = _cmd("tests.apps.ops_app", "-b", UNREACHABLE, "--startup-timeout", "2")
    rc, out, took = _run([*cmd, "--processes", "2"], _env())
    assert rc == 1, out
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert "CRITICAL" in last and "failed during startup (exit code 1)" in last, out
    assert f"cannot reach the Kafka cluster at {UNREACHABLE} within 2s" in last, out
    assert "Traceback" not in out, out
    assert took < 15, out


def test_processes_check_the_app_before_starting_any() -> None:
    cmd = _cmd("tests.apps.ops_ap", "-b", UNREACHABLE, "--processes", "3")
    rc, out, took = _run(cmd, _env())
    assert rc == 1
    _assert_one_line(out, "cannot import app module 'tests.apps.ops_ap'", "fix -A")
    assert took < 10


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_processes_rejects_a_bad_count(value: str) -> None:
    rc, out, _ = _run(_cmd("tests.apps.ops_app", "--processes", value), _env())
    assert rc == 2
    assert "expected a positive number or 'auto'" in out, out
