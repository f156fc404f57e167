"""WorkerProcess: a worker CLI subprocess for tests, demos and crash injection."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType


class WorkerProcess:
    def __init__(
        self,
        app: str,
        *,
        broker: str,
        data_dir: str | Path,
        log_file: str | Path,
        env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.cmd = [
            sys.executable,
            "-m",
            "agents_stream",
            "worker",
            "-A",
            app,
            "--broker",
            broker,
            "--data-dir",
            str(data_dir),
            *(extra_args or []),
        ]
        self.env = {**os.environ, **(env or {})}
        self.log_file = Path(log_file)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = open(self.log_file, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd
        )
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no commit, no flush: a crash."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: a graceful stop."""
        assert self.proc is not None
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.alive:
            self.terminate(10)
