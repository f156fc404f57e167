"""What the JVM servers of the suites share: Apache Kafka (:mod:`.kafka`) and Apicurio
Registry (:mod:`.registry`) are both fetched once with Maven into the user's cache, run as
a subprocess on free loopback ports, polled until they answer, and stopped by signalling
their process group.

One place for it so that a fix (a stop that hangs, a fetch two processes race for, a
server that dies while it is awaited) reaches both. Each server names itself in messages
(``what``) and raises its own :class:`~agents_stream.runtime.embedded.BrokerStartError`
subclass, so a missing ``java`` or ``mvn`` is said in one line naming that server.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..runtime.embedded import BrokerStartError

MIN_JAVA = 17  # Kafka 4.x brokers and Apicurio 2.6 both require Java 17

_JAVA_FIX = "apt-get install openjdk-17-jre-headless"


def find_java(what: str, error: type[BrokerStartError] = BrokerStartError) -> str:
    """Path of a ``java`` 17+ (``JAVA_HOME`` first, then ``PATH``), or ``error`` naming
    ``what`` needs it."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = str(Path(java_home, "bin", "java")) if java_home else None
    java = candidate if candidate and os.access(candidate, os.X_OK) else shutil.which("java")
    if java is None:
        raise error(f"java 17+ not found ({what} runs on it): {_JAVA_FIX}, or set JAVA_HOME")
    major = java_major(java)
    if major is not None and major < MIN_JAVA:
        raise error(
            f"{java} is java {major}, {what} needs {MIN_JAVA}+: "
            f"{_JAVA_FIX} and put it first on PATH, or set JAVA_HOME"
        )
    return java


def java_major(java: str) -> int | None:
    """The major version ``java -version`` prints (None when it cannot be told)."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    # `openjdk version "17.0.15"`, `java version "1.8.0_402"`
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def cache_home(override_env: str, folder: str) -> Path:
    """``$<override_env>`` if set, else ``~/.cache/agents-stream/<folder>`` (XDG)."""
    override = os.environ.get(override_env)
    if override:
        return Path(override).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "agents-stream" / folder


@contextlib.contextmanager
def locked(home: Path) -> Iterator[None]:
    """One fetch at a time per home (parallel test processes share the cache)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_mvn(
    args: list[str], *, what: str, error: type[BrokerStartError], missing: str, quiet: bool = True
) -> None:
    """``mvn -q -B <args>``; ``error(missing)`` without mvn, ``error`` with the last lines
    of its output when it fails (first fetches take minutes: 30 at most)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(missing)
    out = subprocess.run(
        [mvn, "-q", "-B", *args], capture_output=True, text=True, timeout=1800, check=False
    )
    if out.returncode != 0:
        raise error(mvn_failed(what, out.returncode, out.stdout + out.stderr))


def mvn_failed(what: str, code: int, output: str) -> str:
    tail = " | ".join(output.strip().splitlines()[-5:])
    return (
        f"mvn could not fetch {what} (exit {code}): {tail or 'no output'}; check that "
        "Maven Central is reachable (~/.m2/settings.xml proxies/mirrors)"
    )


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held together, so never the same one twice)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class ServerProcess:
    """A server subprocess in its own process group, its output in ``log_file``.

    Subclasses set ``what`` (for messages) and call :meth:`_spawn`, then
    :meth:`_await_ready` with a probe of their own protocol.
    """

    what = "server"
    stop_timeout = 30.0
    log_file: Path | None = None
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def _spawn(
        self, cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        if self.log_file is None:
            fd, name = tempfile.mkstemp(prefix=f"agents-stream-{self.what.split()[-1]}-")
            os.close(fd)
            self.log_file = Path(name)
        out = open(self.log_file, "ab")  # noqa: SIM115 - owned by the child
        self._proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a ^C in the terminal reaches us, not the JVM first
        )
        out.close()

    def _log_tail(self, lines: int = 5) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        return " | ".join(self.log_file.read_text(errors="replace").strip().splitlines()[-lines:])

    def _await_ready(self, deadline: float, probe: Callable[[], object], where: str) -> None:
        """Poll ``probe`` (None: ready; anything else: why not yet) until ``deadline``;
        a server that exits meanwhile is said at once, with its log's last lines."""
        last: object = None
        while time.monotonic() < deadline:
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                self._proc = None
                raise BrokerStartError(
                    f"{self.what} exited with code {proc.returncode} ({self.log_file}): "
                    f"{self._log_tail()}"
                )
            last = probe()
            if last is None:
                return
            time.sleep(0.2)
        self.stop()
        raise BrokerStartError(
            f"{self.what} on {where} not ready in time: {last} ({self.log_file})"
        )

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM to the process group (a controlled shutdown), SIGKILL after ``timeout``
        (``stop_timeout``)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=self.stop_timeout if timeout is None else timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
