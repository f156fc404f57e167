"""A dead letter replayed before its fix (issue 67, item 8): its journaled failure is
replayed, not run again, and the worker's stats count it (they read calls_replayed=0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents_stream.testing.topics import create_topics, produce, wait_for_records

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.failing_call_app:app"


@pytest.mark.broker
def test_a_replayed_dead_letter_counts_its_replayed_failure(broker, topic_factory, worker_factory):
    env = {"AS_APP_ID": topic_factory("app"), "AS_INPUT": topic_factory("in"),
           "AS_OUTPUT": topic_factory("out")}  # fmt: skip
    source = env["AS_INPUT"]
    create_topics(broker.bootstrap, [source], partitions=1)
    worker = worker_factory(APP, env)
    produce(broker.bootstrap, source, [("c1", {"order": "o1"})])
    wait_for_records(broker.bootstrap, f"{source}-dlq", 1, timeout=60)
    replay = subprocess.run(
        [sys.executable, "-m", "agents_stream", "dlq", "replay", "--all", "--yes", "-A", APP,
         "--broker", broker.url],
        env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert replay.returncode == 0 and "replayed 1" in replay.stdout, replay.stderr
    letters = wait_for_records(broker.bootstrap, f"{source}-dlq", 2, timeout=60)
    assert len(letters) == 2, worker.log()
    assert worker.terminate() == 0, worker.log()
    log = worker.log()
    assert "replayed from journal" in log, log
    assert "calls_replayed=1" in log, log
