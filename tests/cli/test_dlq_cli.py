"""`agents-stream dlq` helpers without a broker: which record a dead letter stands for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agents_stream.cli.dlq import DeadLetter, _positions, _select, format_letter
from agents_stream.errors import ConfigurationError
from agents_stream.host.dlq import replay_header


def letter(offset: int, *headers: tuple[str, bytes]) -> DeadLetter:
    return DeadLetter(0, offset, b"k", b"{}", list(headers))


def failed_at(topic: str, partition: int, offset: int, message: str) -> list[tuple[str, bytes]]:
    return [
        ("x-error-stage", b"action"),
        ("x-error-type", b"builtins.RuntimeError"),
        ("x-error-message", message.encode()),
        ("x-source-topic", topic.encode()),
        ("x-source-partition", str(partition).encode()),
        ("x-source-offset", str(offset).encode()),
    ]


def test_a_replay_that_failed_again_stands_for_the_original_record():
    first = letter(0, *failed_at("orders", 1, 7, "boom"))
    again = letter(
        1, ("trace", b"x"), replay_header("orders", 1, 7), *failed_at("orders", 1, 90, "again")
    )
    assert first.source == again.source == ("orders", 1, 7)
    assert "again" in format_letter(again) and "(a replay)" in format_letter(again)
    assert list(_select([first, again], "orders", None)) == [first]  # once per record
    assert list(_select([first, again], "other", None)) == []


def test_positions_are_partition_offset_pairs():
    assert _positions(["0:17,1:3", "2:5"]) == {(0, 17), (1, 3), (2, 5)}
    for bad in (["17"], ["a:1"], ["1:"]):
        with pytest.raises(ConfigurationError, match="partition:offset"):
            _positions(bad)
    with pytest.raises(ConfigurationError, match="no dead letter of orders at 3:4"):
        list(_select([letter(0, *failed_at("orders", 1, 7, "x"))], "orders", {(3, 4)}))


def test_reader_commands_describe_themselves_and_their_default_timeout():
    for command in (["state", "show"], ["state", "stats"], ["dlq", "show"]):
        text = subprocess.run(
            [sys.executable, "-m", "agents_stream", *command, "--help"],
            capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        _, _, rest = text.partition("\n\n")
        description = " ".join(rest.split("\n\n", 1)[0].split())  # argparse wraps lines
        assert not description.startswith("options:"), f"{command}: no description\n{text}"
        flat = " ".join(text.split())
        assert "(default: 30)" in flat and "default 30 s" in description, (command, text)
