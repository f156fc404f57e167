"""Apache Kafka 4.x (KRaft, one node) from Maven Central jars, for suites, benches and dev.

A test and development tool, not a dependency of the library: the guarantees are proven
on real Kafka (compaction, persistence across a restart, isolating transactions), which
the embedded Tansu broker cannot show. Needs ``java`` (17+) always and ``mvn`` for the
first fetch only::

    python -m agents_stream.testing.kafka fetch   # resolve the jars once (needs mvn)
    python -m agents_stream.testing.kafka run     # start in the foreground (make kafka)

The jars are resolved from a generated pom with ``mvn dependency:copy-dependencies`` into
``~/.cache/agents-stream/kafka-<version>/lib`` (``AGENTS_STREAM_KAFKA_HOME`` overrides the
folder; an unpacked release tarball there, with its ``libs/``, is used as it is). A stamp
file marks a complete fetch: after it nothing touches the network.

:class:`KafkaBroker` has the interface of :class:`~agents_stream.testing.EmbeddedBroker`
(``url``, ``bootstrap``, ``port``, ``pid``, ``log_file``, context manager, start/stop), so
test fixtures use either, plus :meth:`KafkaBroker.restart` (same log dirs) and
:meth:`KafkaBroker.kill` for crash tests.

A secured broker (``KafkaBroker(secure=SecureListener(...))``) adds a SASL_SSL listener
(SCRAM-SHA-512 users written at format time, a PEM keystore) and Kafka's
``StandardAuthorizer``; the PLAINTEXT listener stays for the controller and a super user
(``User:ANONYMOUS``) that sets up topics and ACLs. :func:`make_tls` writes a throwaway CA
and broker certificate (``cryptography``) for it: nothing secret is committed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from ..runtime.embedded import BrokerStartError

__all__ = [
    "KAFKA_VERSION",
    "KafkaBroker",
    "KafkaUnavailable",
    "SecureListener",
    "TlsFiles",
    "ensure_kafka",
    "find_java",
    "kafka_home",
    "kafka_missing",
    "make_tls",
]

KAFKA_VERSION = "4.1.1"
# The release tarball logs through log4j2; the Maven artifact only depends on slf4j-api,
# so the binding and log4j itself are added. slf4j-api is pinned to 2.x because the
# log4j-slf4j2-impl binding is found through 2.x's ServiceLoader (Kafka's pom says 1.7.36;
# 2.x serves 1.x callers unchanged).
LOG4J_VERSION = "2.25.3"
SLF4J_VERSION = "2.0.17"
MIN_JAVA = 17  # Kafka 4.x brokers require Java 17

_STAMP = ".agents-stream-complete"


class KafkaUnavailable(BrokerStartError):
    """Java or Maven is missing, or the jars cannot be fetched; the message names the fix."""


# -- locating java and the jars --------------------------------------------------------------


def find_java() -> str:
    """Path of a ``java`` 17+ (``JAVA_HOME`` first, then ``PATH``) or KafkaUnavailable."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = str(Path(java_home, "bin", "java")) if java_home else None
    java = candidate if candidate and os.access(candidate, os.X_OK) else shutil.which("java")
    if java is None:
        raise KafkaUnavailable(
            "java 17+ not found (Apache Kafka runs on it): "
            "apt-get install openjdk-17-jre-headless, or set JAVA_HOME"
        )
    major = _java_major(java)
    if major is not None and major < MIN_JAVA:
        raise KafkaUnavailable(
            f"{java} is java {major}, Apache Kafka {KAFKA_VERSION} needs {MIN_JAVA}+: "
            "apt-get install openjdk-17-jre-headless and put it first on PATH, or set JAVA_HOME"
        )
    return java


def _java_major(java: str) -> int | None:
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


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """Where the jars of ``version`` live (``AGENTS_STREAM_KAFKA_HOME`` overrides)."""
    override = os.environ.get("AGENTS_STREAM_KAFKA_HOME")
    if override:
        return Path(override).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "agents-stream" / f"kafka-{version}"


def _pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.logging.log4j", "log4j-api", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
    ]
    body = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by agents_stream.testing.kafka: resolves Apache Kafka's broker jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.agents-stream</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{body}
  </dependencies>
</project>
"""


def _complete(lib: Path) -> bool:
    """The stamp lists every jar of a finished fetch: all must still be there."""
    stamp = lib / _STAMP
    if not stamp.is_file():
        return False
    names = stamp.read_text().split()
    return bool(names) and all((lib / n).is_file() for n in names)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One fetch at a time per home (parallel test processes share the cache)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_NO_MVN = (
    "mvn not found (it fetches the Apache Kafka {version} jars, first run only): "
    "apt-get install maven, or point AGENTS_STREAM_KAFKA_HOME at an unpacked Kafka release"
)


def _fetched(home: Path) -> Path | None:
    tarball_libs = home / "libs"  # an unpacked release tarball: nothing to fetch
    if any(tarball_libs.glob("kafka_2.13-*.jar")):
        return tarball_libs
    lib = home / "lib"
    return lib if _complete(lib) else None


def kafka_missing(version: str = KAFKA_VERSION) -> str | None:
    """Why Kafka cannot start here (no java, or no jars and no mvn), without starting it."""
    try:
        find_java()
    except KafkaUnavailable as exc:
        return str(exc)
    if _fetched(kafka_home(version)) is None and shutil.which("mvn") is None:
        return _NO_MVN.format(version=version)
    return None


def ensure_kafka(version: str = KAFKA_VERSION, *, quiet: bool = True) -> Path:
    """The folder of Kafka's jars, fetched with Maven on first use (offline afterwards)."""
    home = kafka_home(version)
    fetched = _fetched(home)
    if fetched is not None:
        return fetched
    lib = home / "lib"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable(_NO_MVN.format(version=version))
    with _locked(home):
        if _complete(lib):  # another process fetched while we waited for the lock
            return lib
        staging = Path(tempfile.mkdtemp(prefix="lib-", dir=home))
        try:
            (home / "pom.xml").write_text(_pom(version))
            cmd = [
                mvn,
                "-q",
                "-B",
                "-f",
                str(home / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
            ]
            if not quiet:
                print(f"fetching Apache Kafka {version} jars with Maven into {lib}", flush=True)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
            jars = sorted(p.name for p in staging.glob("*.jar"))
            if out.returncode != 0 or not any(n.startswith("kafka_2.13-") for n in jars):
                tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-5:])
                raise KafkaUnavailable(
                    f"mvn could not fetch Apache Kafka {version} (exit {out.returncode}): "
                    f"{tail or 'no output'}; check that Maven Central is reachable "
                    "(~/.m2/settings.xml proxies/mirrors)"
                )
            (staging / _STAMP).write_text("\n".join(jars) + "\n")
            if lib.exists():
                shutil.rmtree(lib)
            staging.rename(lib)  # all or nothing: a half fetch never looks complete
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return lib


# -- a secured listener ----------------------------------------------------------------------

SCRAM_MECHANISM = "SCRAM-SHA-512"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SUPER_USER = "User:ANONYMOUS"  # the PLAINTEXT listener's principal: controller and set-up


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of :func:`make_tls`: ``ca`` for clients (``ssl.ca.location``),
    ``keystore`` (the broker's unencrypted PKCS#8 key and its certificate) for the broker."""

    ca: Path
    keystore: Path


def make_tls(directory: str | Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
             *, days: int = 2) -> TlsFiles:  # fmt: skip
    """A throwaway CA and a broker certificate it signs, valid for ``hosts`` (IP or DNS
    subject alternative names, so clients' hostname verification passes), as PEM files in
    ``directory`` (mode 600). For tests: the CA key is not kept."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"agents-stream test CA {uuid.uuid4().hex[:8]}")])  # fmt: skip
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    files = TlsFiles(ca=d / "ca.pem", keystore=d / "broker-keystore.pem")
    for path, data in (
        (files.ca, ca_cert.public_bytes(pem)),
        (files.keystore, key_pem + cert.public_bytes(pem) + ca_cert.public_bytes(pem)),
    ):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    return files


@dataclass(frozen=True)
class SecureListener:
    """A SASL_SSL listener (SCRAM-SHA-512) with ACLs enforced.

    Args:
        users: SCRAM-SHA-512 users, name -> password, written when the log dir is
            formatted (``kafka-storage format --add-scram``): a restart keeps them.
        tls: the broker's PEM keystore (and the CA clients trust), from :func:`make_tls`.
        port: the listener's port (a free one when omitted); kept across restarts.
        authorizer: enforce ACLs (``StandardAuthorizer``; a principal with no ACL may do
            nothing). ``super_users`` (the PLAINTEXT listener's ``User:ANONYMOUS`` by
            default: the controller and the set-up of topics and ACLs) bypass them.
    """

    users: Mapping[str, str]
    tls: TlsFiles
    port: int | None = None
    authorizer: bool = True
    super_users: tuple[str, ...] = (SUPER_USER,)
    extra: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # the passwords stay out of test reports
        return f"SecureListener(users={sorted(self.users)}, port={self.port})"


# -- the broker ------------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held together, so never the same one twice)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _cluster_id() -> str:
    # What `kafka-storage.sh random-uuid` prints: a UUID in URL-safe base64, unpadded,
    # never starting with "-" (Kafka's Uuid.randomUuid() draws again too): the storage
    # tool's argument parser takes `-t -xyz...` for an option and the format fails (1 in
    # 64 starts did).
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by agents_stream.testing.kafka: everything to stdout, which goes to the
     broker's log file. shutdownHook off: the JVM's own hook flushes nothing we need and
     log4j's complains when Kafka logs during shutdown. -->
<Configuration status="WARN" shutdownHook="disable">
  <Appenders>
    <Console name="out" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="out"/></Root>
    <!-- One line per partition change: thousands in a suite that creates many topics. -->
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.cluster.Partition" level="WARN"/>
    <Logger name="org.apache.kafka.storage.internals.log" level="WARN"/>
    <Logger name="kafka.log.LogManager" level="WARN"/>
    <Logger name="org.apache.kafka.clients" level="WARN"/>
  </Loggers>
</Configuration>
"""


class KafkaBroker:
    """A single-node KRaft Apache Kafka subprocess on loopback.

    Args:
        port: PLAINTEXT port for clients (a free one when omitted); kept across restarts.
        log_file: where the broker's log goes (``<data_dir>/server.log`` when omitted).
        host: the loopback address to listen on and advertise.
        data_dir: holds server.properties and the log dirs; a temporary folder, removed
            on ``__exit__``, when omitted. Reusing a formatted one keeps its records.
        properties: extra or overriding server properties, e.g.
            ``{"log.cleaner.backoff.ms": "200"}``.
        heap: JVM heap options (``KAFKA_HEAP_OPTS`` when set, else ``-Xmx512m -Xms128m``).
        version: Kafka version to fetch and run.
        secure: also listen with SASL_SSL (SCRAM-SHA-512 users, TLS) and enforce ACLs;
            :attr:`secure_bootstrap` and :meth:`client_config` address it, while
            :attr:`bootstrap` stays the PLAINTEXT super-user listener.
    """

    kind: Literal["kafka"] = "kafka"

    def __init__(
        self,
        port: int | None = None,
        *,
        log_file: str | Path | None = None,
        host: str = "127.0.0.1",
        data_dir: str | Path | None = None,
        properties: Mapping[str, str | int] | None = None,
        heap: str | None = None,
        version: str = KAFKA_VERSION,
        secure: SecureListener | None = None,
    ) -> None:
        self.host = host
        taken = {p for p in (port, secure.port if secure else None) if p}
        free = iter(p for p in _free_ports(2 + len(taken) + 1) if p not in taken)
        self.port = port or next(free)
        self.controller_port = next(free)
        self.secure = secure
        self.secure_port = (secure.port or next(free)) if secure else None
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else None
        self.log_file = Path(log_file) if log_file else None
        self.properties = {k: str(v) for k, v in (properties or {}).items()}
        self.heap = heap or os.environ.get("KAFKA_HEAP_OPTS") or "-Xmx512m -Xms128m"
        self.version = version
        self.start_seconds: float | None = None  # how long the last start() took
        self._proc: subprocess.Popen[bytes] | None = None

    # -- addresses, as EmbeddedBroker ---------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    @property
    def secure_bootstrap(self) -> str:
        """``host:port`` of the SASL_SSL listener (``secure=`` only)."""
        if self.secure_port is None:
            raise ValueError("this broker has no secure listener (KafkaBroker(secure=...))")
        return f"{self.host}:{self.secure_port}"

    @property
    def secure_url(self) -> str:
        return f"kafka://{self.secure_bootstrap}"

    def client_config(self, user: str, password: str | None = None) -> dict[str, str]:
        """librdkafka settings for ``user`` on the SASL_SSL listener (its password from
        ``secure.users`` unless given)."""
        if self.secure is None:
            raise ValueError("this broker has no secure listener (KafkaBroker(secure=...))")
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": self.secure.users[user] if password is None else password,
            "ssl.ca.location": str(self.secure.tls.ca),
        }

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker JVM's process id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def log_dir(self) -> Path:
        """Kafka's ``log.dirs``: the records, kept across :meth:`restart`."""
        return self._dir / "kafka-logs"

    @property
    def _dir(self) -> Path:
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="agents-stream-kafka-"))
        return self.data_dir

    # -- configuration ------------------------------------------------------------------
    def server_properties(self) -> dict[str, str]:
        controller = f"{self.host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            # Kafka 4.x dynamic quorum: the voter set is written by `format --standalone`.
            "controller.quorum.bootstrap.servers": controller,
            "listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://{controller}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            # One node: every internal topic with one replica, or they never come up.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            # Fifty partitions each (the defaults) take seconds to create on first use of
            # a group or a transaction on a two-core box; a handful behave the same.
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.num.partitions": "8",
            # Tests start a consumer group and expect records at once.
            "group.initial.rebalance.delay.ms": "0",
            # Compaction tests: the cleaner looks for work every second, not every 15 s.
            "log.cleaner.backoff.ms": "1000",
            # After a crash the restarted broker's registration waits for the dead
            # incarnation's lease to run out: 3 s, not 9 (crash-restart tests).
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            # KIP-848 groups (group.protocol=consumer): the broker sets the session, 45 s
            # by default and never under 45 s; the suites expect a dead member's
            # partitions to move after 6 s, as the classic clients' setting has it.
            "group.consumer.min.session.timeout.ms": "6000",
            "group.consumer.session.timeout.ms": "6000",
            "group.consumer.min.heartbeat.interval.ms": "1000",
            "group.consumer.heartbeat.interval.ms": "1500",
        }
        if self.secure is not None:
            props.update(self._secure_properties(controller))
        props.update(self.properties)
        return props

    def _secure_properties(self, controller: str) -> dict[str, str]:
        sec = self.secure
        assert sec is not None
        listeners = (
            f"PLAINTEXT://{self.bootstrap},CONTROLLER://{controller},"
            f"SASL_SSL://{self.secure_bootstrap}"
        )
        props = {
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL"
            ),
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            # PEM keystore (KIP-651): the unencrypted PKCS#8 key and the chain in one file.
            "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
            "listener.name.sasl_ssl.ssl.keystore.location": str(sec.tls.keystore),
        }
        if sec.authorizer:
            props["authorizer.class.name"] = STANDARD_AUTHORIZER
            props["super.users"] = ";".join(sec.super_users)
            props["allow.everyone.if.no.acl.found"] = "false"
        props.update(sec.extra)
        return props

    def _write_config(self) -> Path:
        d = self._dir
        d.mkdir(parents=True, exist_ok=True)
        (d / "log4j2.xml").write_text(_LOG4J2_XML)
        path = d / "server.properties"
        lines = ["# Generated by agents_stream.testing.kafka"]
        lines += [f"{k}={v}" for k, v in self.server_properties().items()]
        path.write_text("\n".join(lines) + "\n")
        return path

    def _java_cmd(self, java: str, lib: Path, main: str, *args: str) -> list[str]:
        return [
            java,
            *self.heap.split(),
            # Kafka's own defaults (kafka-run-class.sh).
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._dir / 'log4j2.xml'}",
            "-cp",
            f"{lib}/*",
            main,
            *args,
        ]

    def _format(self, java: str, lib: Path, config: Path) -> None:
        """Format the log dir once; a restart finds meta.properties and skips this."""
        if (self.log_dir / "meta.properties").exists():
            return
        cmd = self._java_cmd(
            java,
            lib,
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            _cluster_id(),
            "-c",
            str(config),
        )
        for user, password in self.secure.users.items() if self.secure else ():
            # Kafka's own syntax; the value ends at "]" and splits at ",": refuse those.
            if any(c in user + password for c in ',[]="') or not user or not password:
                raise BrokerStartError(
                    f'SCRAM user {user!r}: name/password with , [ ] = " or empty'
                )
            cmd += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-5:])
            for password in self.secure.users.values() if self.secure else ():
                tail = tail.replace(password, "[redacted]")
            raise BrokerStartError(f"kafka storage format failed ({out.returncode}): {tail}")

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> KafkaBroker:
        """Fetch if needed, format a new log dir, start, and wait until it serves metadata."""
        if self.running:
            return self
        began = time.monotonic()
        java = find_java()
        lib = ensure_kafka(self.version)
        config = self._write_config()
        self._format(java, lib, config)
        log_file = self.log_file or self._dir / "server.log"
        self.log_file = log_file
        out = open(log_file, "ab")  # noqa: SIM115 - owned by the child
        self._proc = subprocess.Popen(
            self._java_cmd(java, lib, "kafka.Kafka", str(config)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a ^C in the terminal reaches us, not the JVM first
        )
        out.close()
        self._wait_ready(began + timeout)
        self.start_seconds = time.monotonic() - began
        return self

    def _log_tail(self, lines: int = 5) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        text = self.log_file.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last: object = None
        while time.monotonic() < deadline:
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                self._proc = None
                raise BrokerStartError(
                    f"kafka exited with code {proc.returncode} ({self.log_file}): "
                    f"{self._log_tail()}"
                )
            try:
                md = admin.list_topics(timeout=1.0)
                if md.brokers:  # the broker registered with its controller: serving
                    return
                last = "no broker in the metadata yet"
            except Exception as exc:
                last = exc
            time.sleep(0.2)
        self.stop()
        raise BrokerStartError(
            f"kafka on {self.bootstrap} not ready in time: {last} ({self.log_file})"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown, logs flushed), SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL: a crash; the next start() recovers the log dir."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self, timeout: float = 120.0, *, crash: bool = False) -> KafkaBroker:
        """Stop (or kill, with ``crash``) and start again on the same ports and log dir."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start(timeout)

    def cleanup(self) -> None:
        """Stop and remove the data dir if this broker created it."""
        self.stop()
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> KafkaBroker:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


# -- python -m agents_stream.testing.kafka ---------------------------------------------------


def _parse_props(items: list[str]) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        props[key.strip()] = value.strip()
    return props


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents_stream.testing.kafka",
        description="Fetch Apache Kafka's jars and run a single-node KRaft broker.",
    )
    parser.add_argument("command", nargs="?", choices=["run", "fetch"], default="run")
    parser.add_argument("--port", type=int, default=9092, help="client port (0: any free)")
    parser.add_argument("--data-dir", help="keep the log dirs here (default: a temp dir)")
    parser.add_argument("--log-file", help="broker log (default: <data dir>/server.log)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a server property"
    )
    parser.add_argument("--version", default=KAFKA_VERSION, help="Kafka version")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            find_java()
            print(ensure_kafka(args.version, quiet=False))
            return 0
        broker = KafkaBroker(
            args.port or None,
            data_dir=args.data_dir,
            log_file=args.log_file,
            properties=_parse_props(args.set),
            version=args.version,
        )
        ensure_kafka(args.version, quiet=False)
        stopping = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        with broker:
            print(
                f"Apache Kafka {args.version} up in {broker.start_seconds:.1f}s "
                f"(log {broker.log_file}, data {broker.data_dir}); Ctrl-C stops it",
                file=sys.stderr,
            )
            print(f"AGENTS_STREAM_BROKER={broker.url}", flush=True)
            while not stopping and broker.running:
                time.sleep(0.5)
            if not broker.running and not stopping:
                print(f"kafka exited: {broker._log_tail()}", file=sys.stderr)
                return 1
        return 0
    except BrokerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
