"""Apicurio Registry (Confluent-compatible API) from Maven Central, for suites and dev.

A test and development tool, like :mod:`.kafka`: registry-backed Avro is proven against a
real server that judges compatibility and answers in its own words, which confluent-kafka's
``mock://`` registry cannot. Confluent's own registry and Karapace are not on Maven
Central; Apicurio serves the same REST API under ``/apis/ccompat/v7``. Needs ``java``
(17+) always and ``mvn`` for the first fetch only::

    python -m agents_stream.testing.registry fetch   # resolve the tarball once (needs mvn)
    python -m agents_stream.testing.registry run     # foreground on :8081 (make registry)

The release tarball (``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``) is
copied by ``mvn dependency:copy`` and unpacked into
``~/.cache/agents-stream/apicurio-registry-<version>`` (``AGENTS_STREAM_REGISTRY_HOME``
overrides the folder), beside Kafka's jars; a stamp marks a complete unpack, after which
nothing touches the network.

The server keeps its schemas in memory (a restart forgets them) and starts with
``BACKWARD`` as its global compatibility rule: Apicurio's default is NONE, Confluent's is
BACKWARD, and the library's promises are written against Confluent's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from ..runtime.embedded import BrokerStartError
from .launcher import ServerProcess, cache_home, find_java, free_ports, locked, run_mvn

__all__ = [
    "APICURIO_VERSION",
    "CCOMPAT_PATH",
    "RegistryServer",
    "RegistryUnavailable",
    "ensure_registry",
    "registry_home",
    "registry_missing",
]

APICURIO_VERSION = "2.6.13.Final"
ARTIFACT = "io.apicurio:apicurio-registry-app:{version}:tar.gz:all"
CCOMPAT_PATH = "/apis/ccompat/v7"
_STAMP = ".agents-stream-complete"


class RegistryUnavailable(BrokerStartError):
    """Java or Maven is missing, or the tarball cannot be fetched; the message names the fix."""


_NO_MVN = (
    "mvn not found (it fetches Apicurio Registry {version}, first run only): "
    "apt-get install maven, or point AGENTS_STREAM_REGISTRY_HOME at an unpacked "
    "apicurio-registry-app tarball"
)


def registry_home(version: str = APICURIO_VERSION) -> Path:
    """Where the unpacked server of ``version`` lives (``AGENTS_STREAM_REGISTRY_HOME``
    overrides); the same cache folder as Kafka's jars."""
    return cache_home("AGENTS_STREAM_REGISTRY_HOME", f"apicurio-registry-{version}")


def _runner(home: Path, version: str) -> Path:
    return home / f"apicurio-registry-app-{version}-runner.jar"


def _fetched(home: Path, version: str) -> Path | None:
    jar = _runner(home, version)
    # An unpacked tarball someone put there (no stamp) is used as it is, if it has its lib/.
    if jar.is_file() and ((home / _STAMP).is_file() or (home / "lib").is_dir()):
        return jar
    return None


def _java() -> str:
    return find_java(f"Apicurio Registry {APICURIO_VERSION}", RegistryUnavailable)


def registry_missing(version: str = APICURIO_VERSION) -> str | None:
    """Why the registry cannot start here (no java, or no tarball and no mvn)."""
    try:
        _java()
    except RegistryUnavailable as exc:
        return str(exc)
    if _fetched(registry_home(version), version) is None and shutil.which("mvn") is None:
        return _NO_MVN.format(version=version)
    return None


def ensure_registry(version: str = APICURIO_VERSION, *, quiet: bool = True) -> Path:
    """The runner jar of ``version``, fetched with Maven on first use (offline afterwards)."""
    home = registry_home(version)
    jar = _fetched(home, version)
    if jar is not None:
        return jar
    if shutil.which("mvn") is None:
        raise RegistryUnavailable(_NO_MVN.format(version=version))
    with locked(home):
        jar = _fetched(home, version)
        if jar is not None:  # another process fetched while we waited for the lock
            return jar
        staging = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
        try:
            if not quiet:
                print(f"fetching Apicurio Registry {version} with Maven into {home}", flush=True)
            run_mvn(
                ["dependency:copy", f"-Dartifact={ARTIFACT.format(version=version)}",
                 f"-DoutputDirectory={staging}"],
                what=f"Apicurio Registry {version}", error=RegistryUnavailable,
                missing=_NO_MVN.format(version=version),
            )  # fmt: skip
            tarballs = list(staging.glob("*.tar.gz"))
            if not tarballs:
                raise RegistryUnavailable(f"mvn copied no tarball of Apicurio Registry {version}")
            unpacked = staging / "unpacked"
            with tarfile.open(tarballs[0]) as tar:
                tar.extractall(unpacked, filter="data")  # no links or paths out of it
            if not _runner(unpacked, version).is_file():
                raise RegistryUnavailable(
                    f"{tarballs[0].name} holds no {_runner(unpacked, version).name}"
                )
            for item in unpacked.iterdir():  # replace a half unpack of an earlier run
                target = home / item.name
                if target.is_dir():
                    shutil.rmtree(target)
                item.rename(target)
            # Written last: a fetch cut short is never taken for a complete one.
            (home / _STAMP).write_text(f"{version}\n")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return _runner(home, version)


class RegistryServer(ServerProcess):
    """An Apicurio Registry subprocess on a loopback port, in-memory storage.

    Args:
        port: HTTP port (a free one when omitted).
        compatibility: global compatibility rule (``BACKWARD``, Confluent's default).
        log_file: where the server's output goes (a temp file when omitted).
        heap: JVM heap options (``-Xmx256m`` by default: it holds a few schemas).
        version: Apicurio version to fetch and run.

    ``url`` is the Confluent-compatible base URL clients take
    (``http://127.0.0.1:PORT/apis/ccompat/v7``). A context manager: stops on exit.
    """

    what = "apicurio registry"
    stop_timeout = 20.0  # Quarkus shuts down in well under a second

    def __init__(
        self,
        port: int | None = None,
        *,
        compatibility: str = "BACKWARD",
        log_file: str | Path | None = None,
        heap: str = "-Xmx256m",
        version: str = APICURIO_VERSION,
    ) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_ports(1)[0]
        self.compatibility = compatibility
        self.log_file = Path(log_file) if log_file else None
        self.heap = heap
        self.version = version
        self.start_seconds: float | None = None
        self._proc = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{CCOMPAT_PATH}"

    def command(self, java: str, jar: Path) -> list[str]:
        return [
            java,
            *self.heap.split(),
            f"-Dquarkus.http.host={self.host}",
            f"-Dquarkus.http.port={self.port}",
            f"-Dregistry.rules.global.compatibility={self.compatibility}",
            # No usage report to a remote service, no console colours in the log file.
            "-Dquarkus.analytics.disabled=true",
            "-Dquarkus.console.color=false",
            "-jar",
            str(jar),
        ]

    def start(self, timeout: float = 90.0) -> RegistryServer:
        """Fetch if needed, start, and wait until the Confluent API lists subjects."""
        if self.running:
            return self
        began = time.monotonic()
        java = _java()
        jar = ensure_registry(self.version)
        self._spawn(self.command(java, jar), cwd=jar.parent)
        self._await_ready(began + timeout, self._serving, self.url)
        self.start_seconds = time.monotonic() - began
        return self

    def _serving(self) -> object:
        """None once the Confluent API lists subjects (and the global rule is set)."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
                json.load(resp)
            self._put_config()
        except (OSError, ValueError) as exc:  # HTTPError is an OSError too
            return exc
        return None

    def _put_config(self) -> None:
        # The global rule (-D above) is what Apicurio enforces; its Confluent API's GET
        # /config reports NONE until it is set there too, and clients read that one.
        body = json.dumps({"compatibility": self.compatibility}).encode()
        request = urllib.request.Request(
            f"{self.url}/config",
            data=body,
            method="PUT",
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            resp.read()

    def __enter__(self) -> RegistryServer:
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


# -- python -m agents_stream.testing.registry ------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents_stream.testing.registry",
        description="Fetch Apicurio Registry and run it (Confluent API under /apis/ccompat/v7).",
    )
    parser.add_argument("command", nargs="?", choices=["run", "fetch"], default="run")
    parser.add_argument("--port", type=int, default=8081, help="HTTP port (0: any free)")
    parser.add_argument(
        "--compatibility", default="BACKWARD", help="global compatibility rule (default BACKWARD)"
    )
    parser.add_argument("--log-file", help="server log (default: a temp file)")
    parser.add_argument("--version", default=APICURIO_VERSION, help="Apicurio version")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            _java()
            print(ensure_registry(args.version, quiet=False))
            return 0
        ensure_registry(args.version, quiet=False)
        server = RegistryServer(
            args.port or None,
            compatibility=args.compatibility,
            log_file=args.log_file,
            version=args.version,
        )
        stopping = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        with server:
            print(
                f"Apicurio Registry {args.version} up in {server.start_seconds:.1f}s "
                f"(log {server.log_file}, global compatibility {args.compatibility}); "
                "Ctrl-C stops it",
                file=sys.stderr,
            )
            print(f"AGENTS_STREAM_SCHEMA_REGISTRY={server.url}", flush=True)
            while not stopping and server.running:
                time.sleep(0.5)
            if not server.running and not stopping:
                print(f"apicurio registry exited: {server._log_tail()}", file=sys.stderr)
                return 1
        return 0
    except BrokerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
