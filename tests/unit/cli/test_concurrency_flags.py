"""``--code-block-threads`` (worker) and ``--concurrency`` (spark backfill): parsed,
refused below 1 with the flag named, and handed on to each child of ``--processes``."""

from __future__ import annotations

from unittest import mock

import pytest

from agents_stream import App
from agents_stream.cli import worker as worker_cli
from agents_stream.cli.main import build_parser
from agents_stream.errors import ConfigurationError


def test_flags_parse_and_default() -> None:
    parser = build_parser()
    args = parser.parse_args(["worker", "-A", "m:app", "--code-block-threads", "512"])
    assert args.code_block_threads == 512
    assert parser.parse_args(["worker", "-A", "m:app"]).code_block_threads is None
    backfill = parser.parse_args(["spark", "backfill", "-A", "m:app"])
    assert backfill.concurrency == 64
    assert (
        parser.parse_args(["spark", "backfill", "-A", "m:app", "--concurrency", "1"]).concurrency
        == 1
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "-A", "m:app", "--code-block-threads", "0"],
        ["spark", "backfill", "-A", "m:app", "--concurrency", "-3"],
        ["spark", "backfill", "-A", "m:app", "--concurrency", "many"],
    ],
)
def test_counts_below_one_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert "expected a whole number of at least 1" in capsys.readouterr().err


def test_app_refuses_no_threads() -> None:
    with pytest.raises(ConfigurationError, match="code_block_threads"):
        App("a", code_block_threads=0)


def test_supervisor_hands_the_thread_count_to_its_children(tmp_path) -> None:
    args = build_parser().parse_args(
        ["worker", "-A", "m:app", "--code-block-threads", "300", "--processes", "2",
         "--data-dir", str(tmp_path)]
    )  # fmt: skip
    seen: list[list[list[str]]] = []

    class Supervisor:
        def __init__(self, children: list[list[str]], **_: object) -> None:
            seen.append(children)

        def run(self) -> int:
            return 0

    with mock.patch("agents_stream.cli.processes.Supervisor", Supervisor):
        assert worker_cli._supervise(args, App("a"), None) == 0
    for child in seen[0]:
        assert child[child.index("--code-block-threads") + 1] == "300"
