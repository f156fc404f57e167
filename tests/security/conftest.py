"""A secured Apache Kafka for the tests of this folder: SASL_SSL (SCRAM-SHA-512) with a
throwaway CA made here, ACLs enforced (StandardAuthorizer), and principals granted exactly
what ``agents-stream acls`` prints for the app under test (or that minus one ACL).

The test process itself talks to the PLAINTEXT listener as the super user (creating input
topics, producing inputs, reading outputs); every process under test (worker, CLI tools,
Faust host, Spark jobs) gets the secured listener and the principal's credentials the way
an operator passes them: a ``--kafka-config`` file of mode 600 without the password, and
the password in ``AGENTS_STREAM_KAFKA_SASL_PASSWORD``.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from agents_stream.testing import BrokerStartError
from agents_stream.testing.kafka import (
    KafkaBroker,
    KafkaUnavailable,
    SecureListener,
    kafka_missing,
    make_tls,
)

ROOT = Path(__file__).resolve().parents[2]
_n = itertools.count()
USERS = ("worker", "nowrite", "nogroup")


def _required() -> bool:
    return os.environ.get("AGENTS_STREAM_TEST_REQUIRE_KAFKA", "") not in ("", "0")


@dataclass
class Secured:
    """The secured broker, its users' passwords and the CA clients trust."""

    kafka: KafkaBroker
    passwords: dict[str, str]
    base: Path

    @property
    def url(self) -> str:
        return self.kafka.secure_url

    @property
    def admin_bootstrap(self) -> str:
        """PLAINTEXT, the super user: set-up and checks only."""
        return self.kafka.bootstrap

    def client_files(self, user: str, where: Path, *, ca: Path | None = None) -> dict[str, str]:
        """Environment for a process running as ``user``: a mode-600 properties file (no
        password in it) named by AGENTS_STREAM_KAFKA_CONFIG, the password in
        AGENTS_STREAM_KAFKA_SASL_PASSWORD."""
        conf = self.kafka.client_config(user)
        password = conf.pop("sasl.password")
        if ca is not None:
            conf["ssl.ca.location"] = str(ca)
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{user}-{next(_n)}.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("# agents_stream tests: the password comes from the environment\n")
            fh.writelines(f"{k}={v}\n" for k, v in conf.items())
        return {
            "AGENTS_STREAM_KAFKA_CONFIG": str(path),
            "AGENTS_STREAM_KAFKA_SASL_PASSWORD": password,
            "AGENTS_STREAM_BROKER": self.url,
        }


def printed_acls(app: str, principal: str, env: dict[str, str]) -> list[str]:
    """The kafka-acls commands ``agents-stream acls`` prints for ``app``."""
    out = subprocess.run(
        [sys.executable, "-m", "agents_stream", "acls", "-A", app, "--principal", principal],
        env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [ln for ln in out.stdout.splitlines() if ln.startswith("kafka-acls ")]


_RESOURCES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
    "cluster": ResourceType.BROKER,
}


def bindings(command: str) -> list[AclBinding]:
    """A printed ``kafka-acls ... --add`` command as the AclBindings it would create."""
    words = command.split()
    principal = words[words.index("--allow-principal") + 1]
    ops = [words[i + 1] for i, w in enumerate(words) if w == "--operation"]
    pattern = ResourcePatternType.LITERAL
    if "--resource-pattern-type" in words:
        pattern = ResourcePatternType[words[words.index("--resource-pattern-type") + 1].upper()]
    [(kind, name)] = [
        (w[2:], words[i + 1]) for i, w in enumerate(words) if w[2:] in _RESOURCES and w != "--"
    ]
    return [
        AclBinding(
            _RESOURCES[kind],
            name,
            pattern,
            principal,
            "*",
            AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", op).upper()],
            AclPermissionType.ALLOW,
        )
        for op in ops
    ]


@pytest.fixture(scope="package")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """One secured Apache Kafka for the security tests, stopped when they are done (so
    `make test` runs it beside its session broker only meanwhile). Skips without java/mvn
    unless AGENTS_STREAM_TEST_REQUIRE_KAFKA; never against AGENTS_STREAM_TEST_BROKER."""
    if os.environ.get("AGENTS_STREAM_TEST_BROKER"):
        pytest.skip("the security tests start their own secured Kafka")
    missing = kafka_missing()
    if missing is not None:
        if _required():
            pytest.fail(f"Apache Kafka is required here but unavailable: {missing}")
        pytest.skip(f"Apache Kafka unavailable: {missing}")
    base = tmp_path_factory.mktemp("secured")
    passwords = {u: f"pw-{u}-{secrets.token_hex(12)}" for u in USERS}
    tls = make_tls(base / "tls")
    kafka = KafkaBroker(
        data_dir=base / "kafka",
        log_file=base / "kafka.log",
        secure=SecureListener(users=passwords, tls=tls),
    )
    try:
        kafka.start()
    except KafkaUnavailable as exc:
        if _required():
            raise
        pytest.skip(f"Apache Kafka unavailable: {exc}")
    except BrokerStartError:
        kafka.stop()
        raise
    try:
        yield Secured(kafka, passwords, base)
    finally:
        kafka.stop()


def grant(secured: Secured, commands: list[str]) -> list[AclBinding]:
    """Create the ACLs of the printed commands (as the super user)."""
    acls = [b for c in commands for b in bindings(c)]
    admin = AdminClient({"bootstrap.servers": secured.admin_bootstrap, "log_level": 3})
    for fut in admin.create_acls(acls, request_timeout=30).values():
        fut.result()
    return acls


@pytest.fixture
def names(request: pytest.FixtureRequest) -> dict[str, str]:
    """Unique app id and topics for one test (the apps of tests/apps read them from env)."""
    tag = f"{re.sub(r'[^a-z0-9]', '', request.node.name.lower())[:24]}-{os.getpid()}-{next(_n)}"
    return {
        "AS_APP_ID": f"sec-{tag}",
        "AS_INPUT": f"sec-in-{tag}",
        "AS_OUTPUT": f"sec-out-{tag}",
    }
