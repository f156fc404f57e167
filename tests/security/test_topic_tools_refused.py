"""``agents-stream produce`` and ``tail`` as a principal the cluster's ACLs refuse: one
``error:`` line naming the ACL to grant, exit 1, no traceback, within seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agents_stream.testing.topics import create_topics, read_topic
from tests.security.conftest import ROOT, grant

pytestmark = [pytest.mark.kafka_only, pytest.mark.timeout(180)]


def refused(env: dict[str, str], *args: str) -> str:
    began = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "agents_stream", *args],
        env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1 and time.monotonic() - began < 30, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, out.stderr
    return errors[0]


def test_no_acl_on_the_topic(secured, names, tmp_path):
    topic = names["AS_INPUT"]
    create_topics(secured.admin_bootstrap, [topic], partitions=1)
    env = secured.client_files("worker", tmp_path / "conf")
    line = refused(env, "produce", topic, '{"n": 1}', "--timeout", "10")
    assert f"refused User:worker describing topic {topic}" in line, line
    assert f"grant it Describe and Write on topic {topic}" in line, line
    line = refused(env, "tail", topic, "--timeout", "10")
    assert f"grant it Describe and Read on topic {topic}" in line, line


def test_describe_without_write(secured, names, tmp_path):
    """The topic is visible, the write refused: the delivery report's error, one line."""
    topic = names["AS_INPUT"]
    create_topics(secured.admin_bootstrap, [topic], partitions=1)
    grant(
        secured,
        [f"kafka-acls --add --allow-principal User:worker --operation Describe --topic {topic}"],
    )
    env = secured.client_files("worker", tmp_path / "conf")
    line = refused(env, "produce", topic, '{"n": 1}', "--timeout", "10")
    assert f"refused User:worker a write to topic {topic}" in line, line
    assert f"grant it Write and Describe on topic {topic}" in line, line
    assert read_topic(secured.admin_bootstrap, topic) == []
