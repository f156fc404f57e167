"""Dead letters you can act on: `dlq show`, then `dlq replay` after a fix; the replayed
record runs under its original identity, so its journaled call is not executed again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents_stream.host.dlq import original_identity, replay_header
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records
from tests.apps.effects import connect

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.dlq_app:app"


def cli(broker, env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agents_stream", "dlq", *args, "-A", APP, "--broker", broker.url],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_original_identity_parses_only_its_topic():
    headers = [("x", b"1"), replay_header("orders", 3, 41)]
    assert original_identity(headers) == (3, 41)
    assert original_identity(dict(headers), "orders") == (3, 41)
    assert original_identity(headers, "other") is None
    assert original_identity([("x-replay-of", b"orders/x/1")]) is None
    assert original_identity(None) is None


def test_dead_letter_replayed_after_fix_runs_once(broker, topic_factory, worker_factory, tmp_path):
    db = tmp_path / "effects.sqlite"
    connect(str(db)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db),
    }
    source, out = env["AS_INPUT"], env["AS_OUTPUT"]
    create_topics(broker.bootstrap, [source], partitions=2)
    orders = [(f"c{i % 3}", {"order": f"o{i}", "bad": i == 3}) for i in range(6)]
    worker = worker_factory(APP, env)
    produce(broker.bootstrap, source, orders)
    assert len(wait_for_records(broker.bootstrap, out, 5, timeout=60)) == 5, worker.log()
    [letter] = wait_for_records(broker.bootstrap, f"{source}-dlq", 1, timeout=30)
    time.sleep(1.0)  # commits (and pruning of finished records) happen meanwhile
    assert worker.terminate() == 0, worker.log()

    shown = cli(broker, env, "show")
    assert shown.returncode == 0, shown.stderr
    position = f"{letter.partition}:{letter.headers['x-source-offset'].decode()}"
    assert f"{source}[{position.replace(':', ']@')}" in shown.stdout, shown.stdout
    assert "stage=action" in shown.stdout and "RuntimeError" in shown.stdout
    assert "shipping address of o3 missing" in shown.stdout

    fixed = worker_factory(APP, {**env, "AS_FIXED": "1"})
    dry = cli(broker, env, "replay", "--all")
    assert dry.returncode == 0 and "pass --yes" in dry.stdout, dry.stdout + dry.stderr
    done = cli(broker, env, "replay", "--offsets", position, "--yes")
    assert done.returncode == 0 and "replayed 1" in done.stdout, done.stdout + done.stderr
    receipts = wait_for_records(broker.bootstrap, out, 6, timeout=60)
    assert sorted(r.json()["order"] for r in receipts) == [f"o{i}" for i in range(6)]

    # Replaying once more finds the record's action completed: nothing runs, nothing sent.
    again = cli(broker, env, "replay", "--all", "--yes")
    assert again.returncode == 0, again.stderr
    time.sleep(2.0)
    assert len(read_topic(broker.bootstrap, out)) == 6
    assert fixed.terminate() == 0, fixed.log()

    effects = connect(str(db)).execute("SELECT kind, call_id FROM effects").fetchall()
    reserves = [c for k, c in effects if k == "reserve"]
    ships = [c for k, c in effects if k == "ship"]
    # o3's reservation was journaled before the failure: replayed, not executed again.
    assert len(reserves) == 6 and len(set(reserves)) == 6, effects
    assert len(ships) == 6 and len(set(ships)) == 6, effects
    assert "calls_replayed=1" in fixed.log(), fixed.log()
