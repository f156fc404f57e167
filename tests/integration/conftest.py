"""Fixtures for worker subprocess tests."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from agents_stream.testing.process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
_ids = itertools.count()


@pytest.fixture
def worker_factory(broker, tmp_path):
    """Starts worker CLI subprocesses on the test broker; all are stopped at teardown."""
    started: list[WorkerProcess] = []

    def make(app: str, env: dict[str, str], *, extra_args: list[str] | None = None) -> WorkerProcess:
        n = next(_ids)
        proc = WorkerProcess(
            app,
            broker=broker.url,
            data_dir=tmp_path / f"data-{n}",
            log_file=tmp_path / f"worker-{n}.log",
            env=env,
            cwd=ROOT,
            extra_args=extra_args,
        )
        started.append(proc.start())
        return proc

    yield make
    for proc in started:
        if proc.alive:
            proc.kill()
