"""A standalone Spark cluster (one master, one worker) from the installed PySpark.

A test and development tool, like :mod:`.kafka`: the Spark jobs must run where their users
run them, on a cluster whose executors are other processes in other directories, and
``local[*]`` hides exactly what breaks there (executors that cannot import the app's
module, a driver the executors must reach). Both daemons are started with PySpark's own
``bin/spark-class`` (the launcher adds the JVM options Java 17 needs), bound to 127.0.0.1,
and the worker gets its own work directory, so its executors run away from the driver's::

    python -m agents_stream.testing.spark_cluster      # foreground; prints the master URL

``SparkCluster.master_url`` is what ``--master`` takes; ``work_dir`` holds each
executor's ``stdout`` / ``stderr`` (``app-*/<executor id>/``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from ..runtime.embedded import BrokerStartError
from .launcher import ServerProcess, find_java, free_ports

__all__ = ["SparkCluster", "SparkClusterUnavailable", "spark_cluster_missing", "spark_home"]


class SparkClusterUnavailable(BrokerStartError):
    """PySpark or Java is missing; the message names the fix."""


def spark_home() -> Path:
    """The installed PySpark's folder (it holds ``bin/spark-class`` and ``jars/``)."""
    try:
        import pyspark
    except ImportError as exc:
        raise SparkClusterUnavailable(
            "PySpark is not installed: pip install 'agents-stream[spark]'"
        ) from exc
    return Path(pyspark.__file__).parent


def spark_cluster_missing() -> str | None:
    """Why a standalone cluster cannot start here (no PySpark or no Java 17+)."""
    try:
        spark_home()
        find_java("a standalone Spark cluster", SparkClusterUnavailable)
    except SparkClusterUnavailable as exc:
        return str(exc)
    return None


class _Daemon(ServerProcess):
    stop_timeout = 15.0

    def __init__(self, what: str, log_file: Path) -> None:
        self.what = what
        self.log_file = log_file
        self._proc = None


class SparkCluster:
    """A master and one worker on loopback ports; a context manager (stops on exit).

    Args:
        cores: cores the worker offers (its executors run that many tasks at once).
        memory: memory the worker offers, Spark's notation (``1g``).
        work_dir: the worker's work directory (a fresh temp dir when omitted).
        python: interpreter of the executors' Python workers (``PYSPARK_PYTHON`` in the
            daemons' environment); the current one when omitted.
    """

    def __init__(
        self,
        *,
        cores: int = 2,
        memory: str = "1g",
        work_dir: str | Path | None = None,
        python: str | None = None,
    ) -> None:
        self.host = "127.0.0.1"
        self.port, self.webui_port, self.worker_webui_port = free_ports(3)
        self.cores = cores
        self.memory = memory
        self.root = Path(tempfile.mkdtemp(prefix="agents-stream-spark-cluster-"))
        self.work_dir = Path(work_dir) if work_dir else self.root / "work"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.python = python or sys.executable
        self.master = _Daemon("spark master", self.root / "master.log")
        self.worker = _Daemon("spark worker", self.root / "worker.log")
        self.start_seconds: float | None = None

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def env(self) -> dict[str, str]:
        """The daemons' environment: loopback only, the executors' Python."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=self.host,
            SPARK_LOG_DIR=str(self.root),
            PYSPARK_PYTHON=self.python,
            # The daemons' own logs are these files; no pid files in /tmp.
            SPARK_PID_DIR=str(self.root),
        )
        env.pop("PYSPARK_GATEWAY_PORT", None)
        return env

    def start(self, timeout: float = 90.0) -> SparkCluster:
        """Starts the master, then the worker, and waits until the worker is ALIVE."""
        began = time.monotonic()
        find_java("a standalone Spark cluster", SparkClusterUnavailable)
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = self.env()
        self.master._spawn(
            [spark_class, "org.apache.spark.deploy.master.Master",
             "--host", self.host, "--port", str(self.port),
             "--webui-port", str(self.webui_port)],
            env=env,
        )  # fmt: skip
        self.master._await_ready(began + timeout, self._master_up, self.master_url)
        self.worker._spawn(
            [spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url,
             "--host", self.host, "--cores", str(self.cores), "--memory", self.memory,
             "--work-dir", str(self.work_dir), "--webui-port", str(self.worker_webui_port)],
            env=env,
        )  # fmt: skip
        self.worker._await_ready(began + timeout, self._worker_alive, self.master_url)
        self.start_seconds = time.monotonic() - began
        return self

    def _state(self) -> dict[str, Any] | Exception:
        try:
            with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=2) as resp:
                return dict(json.load(resp))
        except (OSError, ValueError) as exc:
            return exc

    def _master_up(self) -> object:
        state = self._state()
        return state if isinstance(state, Exception) else None

    def _worker_alive(self) -> object:
        state = self._state()
        if isinstance(state, Exception):
            return state
        alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
        return None if alive else "no ALIVE worker registered yet"

    def executor_logs(self) -> list[Path]:
        """Every executor's ``stderr`` under the work directory, oldest first."""
        return sorted(self.work_dir.glob("app-*/*/stderr"), key=lambda p: p.stat().st_mtime)

    def stop(self) -> None:
        self.worker.stop()
        self.master.stop()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents_stream.testing.spark_cluster",
        description="Run a standalone Spark cluster (a master and one worker) on 127.0.0.1.",
    )
    parser.add_argument("--cores", type=int, default=2, help="worker cores (default 2)")
    parser.add_argument("--memory", default="1g", help="worker memory (default 1g)")
    args = parser.parse_args(argv)
    try:
        cluster = SparkCluster(cores=args.cores, memory=args.memory).start()
    except BrokerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"spark cluster ready in {cluster.start_seconds:.1f}s: {cluster.master_url} "
        f"(UI {cluster.webui_url}, executors' work dir {cluster.work_dir}); Ctrl-C stops it",
        flush=True,
    )
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        while not stop["now"] and cluster.master.running and cluster.worker.running:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
