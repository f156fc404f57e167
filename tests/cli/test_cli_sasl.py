"""SASL against a broker without it (issue 67, item 6): the line said to fix the user name
and password; the embedded broker has no SASL at all, and Apache Kafka's PLAINTEXT
listener none either. The line says so, and names what to connect with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents_stream.testing.topics import create_topics

ROOT = Path(__file__).resolve().parents[2]
SASL = {
    "AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "AGENTS_STREAM_KAFKA_SASL_MECHANISM": "PLAIN",
    "AGENTS_STREAM_KAFKA_SASL_USERNAME": "someone",
    "AGENTS_STREAM_KAFKA_SASL_PASSWORD": "s3cret-pw",
}


@pytest.mark.broker
def test_sasl_against_a_broker_without_it_says_so(broker, topic_factory):
    topic = topic_factory("sasl")
    create_topics(broker.bootstrap, [topic], partitions=1)
    done = subprocess.run(
        [sys.executable, "-m", "agents_stream", "tail", topic, "--timeout", "5", "-b", broker.url],
        env={**os.environ, **SASL}, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert "sasl.password" not in line and "s3cret-pw" not in line, line
    assert "security.protocol=PLAINTEXT and no sasl.* settings" in line, line
    if broker.kind == "embedded":
        assert line.startswith(f"error: the Kafka cluster at {broker.bootstrap} has no SASL")
        assert "the embedded broker (agents-stream broker)" in line, line
    else:
        assert "offers no SASL on that listener" in line, line
