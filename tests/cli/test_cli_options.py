"""The CLI's options (issue 67, item 9): one help text per shared option, a description
for every command, ``state show KEY`` positional (``--key`` kept), ``produce --raw``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents_stream.cli.main import build_parser, main
from agents_stream.testing.topics import create_topics, read_topic

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("-A", "-b", "--kafka-config", "--schema-registry", "-l")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_command_is_described_and_shared_options_read_the_same():
    helps: dict[str, set[str]] = {}
    commands = list(_commands(build_parser()))
    assert len(commands) > 15
    for path, parser in commands:
        assert parser.description, f"agents-stream {' '.join(path)} has no description"
        for action in parser._actions:
            for option in set(action.option_strings) & set(SHARED):
                helps.setdefault(option, set()).add(str(action.help))
    assert set(helps) == set(SHARED)
    assert all(len(texts) == 1 for texts in helps.values()), helps
    for path, _ in commands:  # every --help prints and exits 0, in-process
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*path, "--help"])
        assert done.value.code == 0, path


@pytest.mark.broker
def test_state_show_takes_the_key_as_an_argument(broker, topic_factory, tmp_path, monkeypatch,
                                                 capsys):  # fmt: skip
    app_id = topic_factory("app")
    (tmp_path / "show_app.py").write_text(
        f"from agents_stream import App\napp = App({app_id!r}, broker={broker.url!r})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    create_topics(broker.bootstrap, [f"{app_id}-action-state"], partitions=1)
    for argv in (["nobody"], ["--key", "nobody"]):
        assert main(["state", "show", "-A", "show_app:app", *argv]) == 1
        assert capsys.readouterr().err.startswith("error: no journal records of key 'nobody'")
    for argv in ([], ["a", "--key", "b"]):
        assert main(["state", "show", "-A", "show_app:app", *argv]) == 2
        assert capsys.readouterr().err == "error: give one key: state show KEY (or --key KEY)\n"


@pytest.mark.broker
def test_produce_raw_sends_the_bytes_as_given(broker, topic_factory, tmp_path):
    topic = topic_factory("raw")
    create_topics(broker.bootstrap, [topic], partitions=1)
    blob = tmp_path / "garbage.bin"
    blob.write_bytes(b"\x00\xffnot avro\n{")
    env = {**os.environ, "AS_INPUT": topic}
    for source in (["not=json {"], ["--file", str(blob)]):
        done = subprocess.run(
            [sys.executable, "-m", "agents_stream", "produce", topic, "--raw", "--key", "k",
             "-A", "tests.apps.avro_app:app", *source, "-b", broker.url],
            capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"produced 1 record to {topic}")
    records = read_topic(broker.bootstrap, topic)
    assert [(r.key, r.value) for r in records] == [
        ("k", b"not=json {"), ("k", b"\x00\xffnot avro\n{")
    ]  # fmt: skip
