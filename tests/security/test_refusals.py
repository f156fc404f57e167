"""On a secured cluster, what is refused ends the worker in one line naming what was refused
and the setting to fix, with a non-zero exit in bounded time and nothing half written:
wrong password, an untrusted broker certificate, and a principal missing one ACL of those
``agents-stream acls`` prints (Write on the ActionState topic; Read on the group)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from agents_stream.testing.kafka import make_tls
from agents_stream.testing.process import WorkerProcess
from agents_stream.testing.topics import create_topics, produce, read_topic
from tests.security.conftest import ROOT, Secured, grant, printed_acls

pytestmark = [pytest.mark.kafka_only, pytest.mark.timeout(240)]

APP = "tests.apps.dlq_app:app"
BOUND = 45.0  # seconds from start to exit


def run_worker(secured: Secured, env: dict[str, str], tmp_path, name: str) -> WorkerProcess:
    proc = WorkerProcess(
        APP,
        broker=secured.url,
        data_dir=tmp_path / "data",
        log_file=tmp_path / f"{name}.log",
        env=env,
        cwd=ROOT,
        extra_args=["--worker-id", name, "--startup-timeout", "20"],
    )
    return proc.start()


def exits(proc: WorkerProcess, bound: float = BOUND) -> tuple[int, float, str]:
    """(exit code, seconds, the last log line) once it exits; fails past ``bound``."""
    began = time.monotonic()
    assert proc.proc is not None
    try:
        code = proc.proc.wait(bound)
    except Exception:
        proc.kill()
        pytest.fail(f"worker still running after {bound}s:\n{proc.log()[-3000:]}")
    lines = [ln for ln in proc.log().splitlines() if ln.strip()]
    took = time.monotonic() - began
    print(f"\n{proc.log_file.stem}: exit {code} after {took:.1f}s")  # figures for the docs
    return code, took, lines[-1] if lines else ""


def _setup(secured: Secured, names, tmp_path, user: str, drop=None) -> dict[str, str]:
    env = {**names, "AS_EFFECTS_DB": str(tmp_path / "effects.sqlite")}
    commands = printed_acls(APP, f"User:{user}", env)
    if drop is not None:
        commands = [drop(c) for c in commands]
    grant(secured, commands)
    create_topics(secured.admin_bootstrap, [names["AS_INPUT"]], partitions=2)
    return {**env, **secured.client_files(user, tmp_path / "conf")}


def committed(secured: Secured, names: dict[str, str]) -> dict[int, int]:
    """The group's committed input offsets, read as the super user."""
    consumer = Consumer(
        {"bootstrap.servers": secured.admin_bootstrap, "group.id": names["AS_APP_ID"]}
    )
    try:
        tps = [TopicPartition(names["AS_INPUT"], p) for p in range(2)]
        return {
            tp.partition: tp.offset for tp in consumer.committed(tps, timeout=30) if tp.offset >= 0
        }
    finally:
        consumer.close()


def _no_secret(secured: Secured, *texts: str) -> None:
    for text in texts:
        for password in secured.passwords.values():
            assert password not in text


def test_wrong_password(secured, names, tmp_path):
    env = _setup(secured, names, tmp_path, "worker")
    env["AGENTS_STREAM_KAFKA_SASL_PASSWORD"] = "not-the-password"
    proc = run_worker(secured, env, tmp_path, "badpw")
    code, took, last = exits(proc)
    assert code != 0 and took < BOUND
    assert "refused authentication" in last and "sasl.password" in last, last
    assert "invalid credentials" in last, last
    _no_secret(secured, proc.log())


def test_untrusted_certificate(secured, names, tmp_path):
    env = _setup(secured, names, tmp_path, "worker")
    other = make_tls(tmp_path / "other-ca")
    env.update(secured.client_files("worker", tmp_path / "conf", ca=other.ca))
    proc = run_worker(secured, env, tmp_path, "badca")
    code, took, last = exits(proc)
    assert code != 0 and took < BOUND
    assert "certificate verify failed" in last and "ssl.ca.location" in last, last
    _no_secret(secured, proc.log())


def without_one_acl(secured, names, tmp_path, user: str, op: str, resource: str):
    """Run a worker of ``user``, granted what `agents-stream acls` prints but ``op`` on
    ``resource``, and one input record; returns (exit code, last log line, its log)."""

    def drop(command: str) -> str:
        return command.replace(f" --operation {op}", "") if command.endswith(resource) else command

    env = _setup(secured, names, tmp_path, user, drop)
    proc = run_worker(secured, env, tmp_path, user)
    produce(secured.admin_bootstrap, names["AS_INPUT"], [("k1", {"order": "o1"})])
    code, took, last = exits(proc)
    assert code != 0 and took < BOUND
    assert read_topic(secured.admin_bootstrap, names["AS_OUTPUT"]) == []
    _no_secret(secured, proc.log())
    return last


def test_no_write_on_action_state(secured, names, tmp_path):
    state = f"{names['AS_APP_ID']}-action-state"
    last = without_one_acl(secured, names, tmp_path, "nowrite", "Write", f"--topic {state}")
    assert f"refused User:nowrite a write to topic {state}" in last, last
    assert f"grant it Write on topic {state}" in last, last
    # Nothing half written: no output (checked above), no dead letter (the record is not
    # the culprit), the input not committed (a worker granted Write runs it).
    assert read_topic(secured.admin_bootstrap, f"{names['AS_INPUT']}-dlq") == []
    assert set(committed(secured, names).values()) <= {0}  # the one record at offset 0


def test_no_read_on_group(secured, names, tmp_path):
    group = names["AS_APP_ID"]
    last = without_one_acl(secured, names, tmp_path, "nogroup", "Read", f"--group {group}")
    assert f"refused User:nogroup the consumer group {group}" in last, last
    assert f"grant it Read and Describe on group {group}" in last, last


@pytest.mark.parametrize("command", [["dlq", "show"], ["state", "stats"]])
def test_cli_tools_refused_in_one_line(secured, names, tmp_path, command):
    env = _setup(secured, names, tmp_path, "worker")
    env["AGENTS_STREAM_KAFKA_SASL_PASSWORD"] = "not-the-password"
    began = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "agents_stream", *command, "-A", APP],
        env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - began
    assert out.returncode != 0 and took < BOUND, (took, out.stderr)
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "refused authentication" in errors[0], out.stderr
    assert "Traceback" not in out.stderr
    _no_secret(secured, out.stdout + out.stderr)
