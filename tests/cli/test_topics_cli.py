"""``agents-stream produce`` and ``tail`` against the session's broker, as a user runs them
(subprocesses, the worker's client settings), and their one-line errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents_stream.cli.topics import landed_text, parse_record
from agents_stream.testing.topics import create_topics, read_topic

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "agents_stream", *args],
        input=stdin, capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_records_are_json_or_key_equals_json():
    assert parse_record('{"a": 1}', None) == (None, {"a": 1})
    assert parse_record('u-1={"a": "x=y"}', None) == ("u-1", {"a": "x=y"})
    assert parse_record('"k=v"', "d") == ("d", "k=v")  # a JSON string, not a key
    assert parse_record("42", "d") == ("d", 42)
    with pytest.raises(ValueError, match="not JSON"):
        parse_record("u-1={oops", None)


@pytest.mark.broker
def test_produce_then_tail_round_trip(broker, topic_factory, tmp_path):
    topic = topic_factory("t")
    create_topics(broker.bootstrap, [topic], partitions=2)
    env = {"AGENTS_STREAM_BROKER": broker.url}
    sent = cli("produce", topic, 'u-1={"n": 1}', "--header", "trace=abc", env=env)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith(f"produced 1 record to {topic}: partition ")
    piped = cli("produce", topic, "--key", "u-2", stdin='{"n": 2}\n\n# a comment\n{"n": 3}\n',
                env=env)  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    lines = tmp_path / "records.jsonl"
    lines.write_text('u-3={"n": 4}\n')
    filed = cli("produce", topic, "--file", str(lines), "--broker", broker.url)
    assert filed.returncode == 0, filed.stderr

    tail = cli("tail", topic, "--max", "4", "--timeout", "60", "--json", env=env)
    assert tail.returncode == 0, tail.stderr
    rows = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted((r["key"], r["value"]["n"]) for r in rows) == [
        ("u-1", 1), ("u-2", 2), ("u-2", 3), ("u-3", 4),
    ]  # fmt: skip
    assert {r["headers"].get("trace") for r in rows if r["key"] == "u-1"} == {"abc"}
    plain = cli("tail", topic, "--max", "1", "--partition", str(rows[0]["partition"]), env=env)
    assert plain.returncode == 0 and f"{topic}[{rows[0]['partition']}]@0 key=" in plain.stdout


@pytest.mark.broker
def test_avro_goes_through_the_apps_codec(broker, topic_factory):
    env = {"AS_APP_ID": topic_factory("app"), "AS_INPUT": topic_factory("in"),
           "AS_OUTPUT": topic_factory("out"), "AGENTS_STREAM_BROKER": broker.url}  # fmt: skip
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=1)
    app = "tests.apps.avro_app:app"
    sent = cli("produce", env["AS_INPUT"], "-A", app, 'o={"order": "o-1", "amount": 2.5}', env=env)
    assert sent.returncode == 0, sent.stderr
    [record] = read_topic(broker.bootstrap, env["AS_INPUT"])
    assert not record.value.startswith(b"{")  # Avro, not JSON text
    shown = cli("tail", env["AS_INPUT"], "-A", app, "--max", "1", "--timeout", "30", env=env)
    assert shown.returncode == 0 and '"amount": 2.5' in shown.stdout, shown.stderr
    refused = cli("produce", env["AS_INPUT"], "-A", app, '{"order": "o-2"}', env=env)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "argument 1" in refused.stderr


@pytest.mark.broker
def test_bad_input_is_one_line_and_nothing_is_sent(broker, topic_factory):
    topic = topic_factory("t")
    create_topics(broker.bootstrap, [topic], partitions=1)
    env = {"AGENTS_STREAM_BROKER": broker.url}
    bad = cli("produce", topic, '{"n": 1}', "u-2={oops", env=env)
    assert bad.returncode == 1 and bad.stderr.startswith("error: argument 2: not JSON")
    assert bad.stderr.count("\n") == 1
    assert read_topic(broker.bootstrap, topic) == []  # the good one was not sent either
    missing = cli("produce", topic_factory("nope"), "{}", "--timeout", "1", env=env)
    assert missing.returncode == 1 and "does not exist" in missing.stderr


@pytest.mark.broker
def test_a_missing_topic_is_said_within_the_start_up_budget(broker, topic_factory):
    """Issue 67, item 3: produce and tail waited 30 s for a topic that does not exist."""
    env = {"AGENTS_STREAM_BROKER": broker.url}
    for command in (["produce", topic_factory("nope"), "{}"], ["tail", topic_factory("nope")]):
        started = time.monotonic()
        done = cli(*command, env=env)
        assert done.returncode == 1, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "(waited 10s)" in done.stderr
        assert time.monotonic() - started < 20


def test_no_broker_is_one_line():
    env = {k: v for k, v in os.environ.items() if k != "AGENTS_STREAM_BROKER"}
    result = subprocess.run(
        [sys.executable, "-m", "agents_stream", "tail", "x", "--timeout", "1"],
        capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.startswith("error: no broker")


def test_help_names_defaults_and_environment():
    timeouts = {}
    for command in ("produce", "tail"):
        text = cli(command, "--help").stdout
        assert "AGENTS_STREAM_BROKER" in text and "AGENTS_STREAM_KAFKA_CONFIG" in text
        assert "examples:" in text
        own = text.split("\n  --timeout SECONDS", 1)[1].split("\n  -", 1)[0]
        timeouts[command] = " ".join(own.split())  # argparse wraps lines
    # Each command's own --timeout: what it bounds, and its default.
    assert "acknowledged (default: 30)" in timeouts["produce"], timeouts
    assert "stop after this long" in timeouts["tail"], timeouts
    assert "run until interrupted" in timeouts["tail"], timeouts
    assert "read_committed" in cli("tail", "--help").stdout


def test_offsets_are_printed_as_ranges_per_partition():
    assert landed_text("t", [(3, 0)]) == "produced 1 record to t: partition 3 offset 0"
    many = [(p, o) for p in range(3) for o in range(60)] + [(1, 70), (1, 71)]
    assert landed_text("t", many).splitlines() == [
        "produced 182 records to t:",
        "  partition 0 offsets 0-59",
        "  partition 1 offsets 0-59, 70-71",
        "  partition 2 offsets 0-59",
    ]


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``error:`` line of a refused command (exit 1, no traceback)."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_bad_header_is_one_line():
    for header in ("trace", "=abc"):
        line = one_line(cli("produce", "t", "-b", "kafka://127.0.0.1:1", "-H", header, "{}"))
        assert "expected NAME=VALUE" in line


def _big_record(tmp_path: Path) -> Path:
    """One 2 MB record of random text: the producer's compression cannot shrink it under
    Kafka's 1 MB limits, as it would 2 MB of one letter."""
    big = tmp_path / "big.jsonl"
    text = base64.b64encode(os.urandom(1_500_000)).decode()  # 2,000,000 characters
    big.write_text('k={"text": "' + text + '"}\n')
    return big


@pytest.mark.broker
def test_an_oversized_record_is_one_line_naming_the_settings(broker, topic_factory, tmp_path):
    """2 MB: refused by the producer itself (librdkafka's message.max.bytes, 1,000,000)
    before any broker sees it."""
    topic = topic_factory("big")
    create_topics(broker.bootstrap, [topic], partitions=1)
    env = {"AGENTS_STREAM_BROKER": broker.url}
    line = one_line(cli("produce", topic, "--file", str(_big_record(tmp_path)), env=env))
    assert "2,000,011 bytes" in line and "refused by the producer" in line, line
    assert f"--entity-name {topic} --add-config max.message.bytes=N" in line, line
    assert "AGENTS_STREAM_KAFKA_MESSAGE_MAX_BYTES" in line, line


@pytest.mark.kafka_only
def test_a_record_over_the_topics_limit_is_one_line(broker, topic_factory, tmp_path):
    """The producer's limit raised, Apache Kafka's topic limit (max.message.bytes,
    1,048,588) refuses the record: the delivery report's error, one line."""
    topic = topic_factory("big")
    create_topics(broker.bootstrap, [topic], partitions=1)
    env = {"AGENTS_STREAM_BROKER": broker.url, "AGENTS_STREAM_KAFKA_MESSAGE_MAX_BYTES": "3000000"}
    line = one_line(cli("produce", topic, "--file", str(_big_record(tmp_path)), env=env))
    assert "over the size limit" in line and "too large" in line.lower(), line
    assert f"--entity-name {topic} --add-config max.message.bytes=N" in line, line
    assert "(0 of 1 record(s) acknowledged)" in line, line
    assert read_topic(broker.bootstrap, topic) == []


@pytest.mark.broker
def test_tail_of_a_missing_topic_is_one_line(broker, topic_factory):
    env = {"AGENTS_STREAM_BROKER": broker.url}
    line = one_line(cli("tail", topic_factory("nope"), "--timeout", "1", env=env))
    assert "does not exist" in line and "waited 1s" in line
