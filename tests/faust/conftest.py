"""Faust host fixtures: Faust worker subprocesses on the session broker. (Imports no
faust: each test module skips itself when faust-streaming is not installed.)"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from agents_stream.testing.process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
_n = itertools.count()


class FaustProcess(WorkerProcess):
    """``python -m <module> worker -l info``: a Faust worker, killed or stopped like a
    WorkerProcess."""

    def __init__(self, module: str, *, log_file: Path, env: dict[str, str]) -> None:
        super().__init__(module, broker="", data_dir="", log_file=log_file, env=env, cwd=ROOT)
        self.cmd = [sys.executable, "-m", module, "worker", "-l", "info"]


@pytest.fixture
def faust_factory(tmp_path):
    """Starts Faust worker subprocesses; all are killed at teardown."""
    started: list[FaustProcess] = []

    def make(module: str, env: dict[str, str]) -> FaustProcess:
        proc = FaustProcess(module, log_file=tmp_path / f"faust-{next(_n)}.log", env=env)
        started.append(proc.start())
        return proc

    yield make
    for proc in started:
        if proc.alive:
            proc.kill()
