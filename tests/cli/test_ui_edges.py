"""``agents-stream ui`` at its edges (issue 67, item 4): a dead broker ends the start in
one line within 10 s, as the worker's start does (it served on and logged a raw
``KafkaError{...} (retrying)`` every 12 s); a journal it cannot read yet is logged once
per change, not once per retry."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents_stream.console.journal import JournalIndex, JournalTailer
from agents_stream.serde.journal import default_journal_codec
from agents_stream.testing.topics import create_topics

pytest.importorskip("aiohttp")
ROOT = Path(__file__).resolve().parents[2]


def test_ui_against_a_dead_broker_fails_at_start_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agents_stream", "ui", "-A", "tests.apps.dlq_app:app",
         "--broker", f"kafka://127.0.0.1:{port}", "--port", "0"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(f"error: cannot reach the Kafka cluster at 127.0.0.1:{port}")
    assert time.monotonic() - started < 20


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("agents_stream.console")]


@pytest.mark.broker
def test_the_journal_not_readable_yet_is_logged_once_then_its_reading(
    broker, topic_factory, caplog
):
    topic = topic_factory("journal")
    index = JournalIndex(default_journal_codec().decode, "app")
    caplog.set_level(logging.INFO, logger="agents_stream.console")
    tailer = JournalTailer(broker.bootstrap, topic, index).start()
    try:
        time.sleep(4.5)  # two retries at least (every 2 s)
        said = _said(caplog)
        assert len(said) == 1 and said[0].startswith(f"cannot read {topic}: topic "), said
        assert index.error is not None and "KafkaError{" not in index.error, index.error
        create_topics(broker.bootstrap, [topic], partitions=1)
        deadline = time.monotonic() + 20
        while index.error is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert index.error is None
        said = _said(caplog)
        assert said[1:] == [f"reading {topic} again"], said
    finally:
        tailer.stop()
