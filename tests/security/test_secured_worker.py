"""The worker and the CLI tools on a secured cluster (SASL_SSL, SCRAM-SHA-512, ACLs), as a
principal granted exactly what ``agents-stream acls`` prints: records processed end to
end, dead letters shown and replayed, the ActionState inspected, the cache rebuilt from
the journal topic after a restart with an empty data dir; and the password in none of the
output (logs, CLI output, metrics page, --help)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from agents_stream.testing.process import WorkerProcess
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps.effects import connect
from tests.security.conftest import ROOT, Secured, grant, printed_acls

pytestmark = [pytest.mark.kafka_only, pytest.mark.timeout(300)]

APP = "tests.apps.dlq_app:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """An ``agents-stream`` command with the principal's environment (no secret flags)."""
    return subprocess.run(
        [sys.executable, "-m", "agents_stream", *args],
        env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def secured_setup(secured: Secured, names: dict[str, str], tmp_path, user: str = "worker"):
    """The principal granted what `agents-stream acls` prints; its environment."""
    env = {**names, "AS_EFFECTS_DB": str(tmp_path / "effects.sqlite")}
    grant(secured, printed_acls(APP, f"User:{user}", env))
    create_topics(secured.admin_bootstrap, [names["AS_INPUT"]], partitions=2)
    return {**env, **secured.client_files(user, tmp_path / "conf")}


def assert_no_password(secured: Secured, texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for user, password in secured.passwords.items():
            assert password not in text, f"the password of {user} appears in {where}"


def test_worker_dlq_state_and_rebuild_as_granted_principal(secured, names, tmp_path):
    env = secured_setup(secured, names, tmp_path)
    connect(env["AS_EFFECTS_DB"]).close()
    source, out = names["AS_INPUT"], names["AS_OUTPUT"]
    seen: dict[str, str] = {}

    def worker(name: str, extra: dict[str, str], args: list[str]) -> WorkerProcess:
        return WorkerProcess(
            APP, broker=secured.url, data_dir=tmp_path / "data", env={**env, **extra},
            log_file=tmp_path / f"{name}.log", cwd=ROOT, extra_args=["--worker-id", name, *args],
        ).start()  # fmt: skip

    port = free_port()
    first = worker("w1", {}, ["--metrics-port", str(port)])
    orders = [(f"c{i % 3}", {"order": f"o{i}", "bad": i == 3}) for i in range(6)]
    produce(secured.admin_bootstrap, source, orders)
    assert len(wait_for_records(secured.admin_bootstrap, out, 5, timeout=90)) == 5, first.log()
    [letter] = wait_for_records(secured.admin_bootstrap, f"{source}-dlq", 1, timeout=30)
    for page in ("metrics", "healthz", "readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{page}", timeout=10) as r:
            seen[f"/{page}"] = r.read().decode()
    assert "agents_stream" in seen["/metrics"]
    time.sleep(1.0)  # a commit meanwhile
    assert first.terminate() == 0, first.log()
    seen["worker 1 log"] = first.log()

    shown = cli(env, "dlq", "show", "-A", APP)
    assert shown.returncode == 0, shown.stderr
    assert "shipping address of o3 missing" in shown.stdout, shown.stdout
    stats = cli(env, "state", "stats", "-A", APP)
    assert stats.returncode == 0 and "Orders.process" in stats.stdout, stats.stdout + stats.stderr
    key = cli(env, "state", "show", "-A", APP, "--key", letter.key or "")
    assert key.returncode == 0 and "reserve" in key.stdout, key.stdout + key.stderr
    for name, run in (("dlq show", shown), ("state stats", stats), ("state show", key)):
        seen[name] = run.stdout + run.stderr

    # Restart with the local cache gone: rebuilt from the ActionState topic (Read on it).
    shutil.rmtree(tmp_path / "data")
    second = worker("w2", {"AS_FIXED": "1"}, [])
    position = f"{letter.partition}:{letter.headers['x-source-offset'].decode()}"
    replay = cli(env, "dlq", "replay", "-A", APP, "--offsets", position, "--yes")
    assert replay.returncode == 0 and "replayed 1" in replay.stdout, replay.stdout + replay.stderr
    seen["dlq replay"] = replay.stdout + replay.stderr
    receipts = wait_for_records(secured.admin_bootstrap, out, 6, timeout=90)
    assert sorted(r.json()["order"] for r in receipts) == [f"o{i}" for i in range(6)]
    assert second.terminate() == 0, second.log()
    seen["worker 2 log"] = log = second.log()
    rebuilt = [ln for ln in log.splitlines() if "replayed" in ln and "journal records" in ln]
    assert rebuilt and any(" 0 journal records" not in ln for ln in rebuilt), log
    # o3's reservation was journaled by the first worker: replayed from the rebuilt cache,
    # never executed again.
    assert "calls_replayed=1" in log, log
    effects = connect(env["AS_EFFECTS_DB"]).execute("SELECT kind, call_id FROM effects")
    reserves = [c for k, c in effects.fetchall() if k == "reserve"]
    assert len(reserves) == len(set(reserves)) == 6

    # Each receipt once (compared by position: partitions interleave as they arrive).
    def by_position(records):  # type: ignore[no-untyped-def]
        return sorted(records, key=lambda r: (r.partition, r.offset))

    assert by_position(read_topic(secured.admin_bootstrap, out)) == by_position(receipts)

    for command in (["--help"], ["worker", "--help"], ["dlq", "--help"], ["state", "--help"],
                    ["acls", "--help"], ["spark", "--help"]):  # fmt: skip
        helped = cli(env, *command)
        seen[" ".join(command)] = helped.stdout + helped.stderr
    assert_no_password(secured, seen)


EOS_APP = "tests.security.eos_app:app"


@pytest.mark.parametrize("granted", ["all", "no-transactional-id"])
def test_exactly_once_needs_the_transactional_id_acl(secured, names, tmp_path, granted):
    """An exactly-once app's principal: what `acls` prints (its transactional-id prefix
    included) runs it; without the transactional-id ACL the worker stops in one line."""
    env = {**names}
    commands = printed_acls(EOS_APP, "User:worker", env)
    assert any(c.endswith(f"--transactional-id {names['AS_APP_ID']}-") for c in commands)
    if granted != "all":
        commands = [c for c in commands if "--transactional-id" not in c]
    grant(secured, commands)
    create_topics(secured.admin_bootstrap, [names["AS_INPUT"]], partitions=2)
    env.update(secured.client_files("worker", tmp_path / "conf"))
    proc = WorkerProcess(
        EOS_APP, broker=secured.url, data_dir=tmp_path / "data", env=env,
        log_file=tmp_path / "eos.log", cwd=ROOT, extra_args=["--worker-id", "e1"],
    ).start()  # fmt: skip
    produce(
        secured.admin_bootstrap,
        names["AS_INPUT"],
        [(f"k{i}", {"order": f"o{i}"}) for i in range(4)],
    )
    if granted == "all":
        outs = wait_for_records(secured.admin_bootstrap, names["AS_OUTPUT"], 4, timeout=90)
        assert sorted(r.json()["order"] for r in outs) == ["o0", "o1", "o2", "o3"], proc.log()
        assert proc.terminate() == 0, proc.log()
    else:
        assert proc.proc is not None
        code = proc.proc.wait(45)
        [line] = [ln for ln in proc.log().splitlines() if "CRITICAL agents_stream.cli" in ln]
        assert "Traceback" not in proc.log(), proc.log()[-3000:]
        assert code != 0 and "refused User:worker a transactional producer" in line, line
        assert "Write and Describe on the transactional ids prefixed" in line, line
    assert_no_password(secured, {"worker log": proc.log()})
