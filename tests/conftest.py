"""Session fixtures: one real broker subprocess for the whole run, unique topic names."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents_stream.testing import EmbeddedBroker
from agents_stream.testing.process import WorkerProcess

ROOT = Path(__file__).resolve().parents[1]
_names = itertools.count()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """The embedded Tansu broker, or the cluster named by AGENTS_STREAM_TEST_BROKER."""
    external = os.environ.get("AGENTS_STREAM_TEST_BROKER")
    if external:  # e.g. a real Kafka cluster: the same tests, no quirks
        host, _, port = external.removeprefix("kafka://").rpartition(":")
        yield EmbeddedBroker(port=int(port), host=host)  # never started: only addresses
        return
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_file=log) as b:
        yield b


@pytest.fixture
def topic_factory(request: pytest.FixtureRequest):
    """Returns unique topic names per test so tests never see each other's records."""

    def make(prefix: str = "t") -> str:
        base = request.node.name.replace("[", "-").replace("]", "")[:40]
        return f"{prefix}-{base}-{os.getpid()}-{next(_names)}"

    return make


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def worker_factory(broker, tmp_path):
    """Starts worker CLI subprocesses on the test broker; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def make(
        app: str, env: dict[str, str], *, extra_args: list[str] | None = None
    ) -> WorkerProcess:
        n = next(_names)
        proc = WorkerProcess(
            app,
            broker=broker.url,
            data_dir=tmp_path / "data",
            log_file=tmp_path / f"worker-{n}.log",
            env=env,
            cwd=ROOT,
            extra_args=[*(extra_args or []), "--worker-id", f"w{n}"],
        )
        started.append(proc.start())
        return proc

    yield make
    for proc in started:
        if proc.alive:
            proc.kill()
