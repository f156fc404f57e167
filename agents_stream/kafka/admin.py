"""Topic creation and validation: inputs, outputs, DLQs and the compacted ActionState topic."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from ..errors import ConfigurationError, KafkaIOError
from .config import admin_config, common_config, scrub

log = logging.getLogger("agents_stream.kafka")

# Kafka's own rule (org.apache.kafka.common.internals.Topic): brokers reject anything else,
# and some clients fail late and obscurely on it.
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_LENGTH = 249


def validate_topic_names(names: Iterable[str]) -> None:
    """Raise ConfigurationError for the first name Kafka would reject (no I/O)."""
    for name in names:
        if not name or name in (".", ".."):
            problem = "is empty" if not name else "is reserved"
        elif len(name) > MAX_TOPIC_LENGTH:
            problem = f"is {len(name)} characters long (Kafka allows {MAX_TOPIC_LENGTH})"
        elif not _LEGAL_TOPIC.match(name):
            bad = "".join(sorted({c for c in name if not re.match(r"[a-zA-Z0-9._-]", c)}))
            problem = f"contains {bad!r} (Kafka allows only a-z A-Z 0-9 . _ -)"
        else:
            continue
        raise ConfigurationError(f"invalid topic name {name!r}: it {problem}; rename it in the App")


_CONFIG_WHERE = "--kafka-config, AGENTS_STREAM_KAFKA_* or App(kafka_config)"
# "sasl_ssl://h:p/bootstrap: SSL handshake failed: ... (after 16ms in state SSL_HANDSHAKE)"
_BROKER_PREFIX = re.compile(r"^\S+://\S+?: ")
_AFTER = re.compile(r" \(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)$")


# "SASL PLAIN mechanism handshake failed: Broker: Unsupported SASL mechanism: broker's
# supported mechanisms: SCRAM-SHA-512"
_MECHANISMS = re.compile(r"SASL (\S+) mechanism handshake failed: .*supported mechanisms: ?(.*)$")


def refusal(error: KafkaError, bootstrap: str) -> str | None:
    """One line naming what the cluster refused and the setting to fix, for an
    authentication or TLS error librdkafka reported (None for any other error)."""
    text = _AFTER.sub("", _BROKER_PREFIX.sub("", scrub(error.str())))
    mechanisms = _MECHANISMS.search(text) if error.code() == KafkaError._AUTHENTICATION else None
    if mechanisms is not None:
        wanted, offered = mechanisms.group(1), mechanisms.group(2).strip()
        if wanted in offered.replace(",", " ").split():
            # No user name or password is at fault: the embedded broker (tansu) has no
            # SASL, and answers a handshake refusing the very mechanism it lists.
            return (
                f"the Kafka cluster at {bootstrap} has no SASL ({text}): it answers as the "
                "embedded broker (agents-stream broker) does, which has no SASL nor TLS; "
                "connect with security.protocol=PLAINTEXT and no sasl.* settings in "
                f"{_CONFIG_WHERE}"
            )
        if not offered:  # Apache Kafka's PLAINTEXT listener
            return (
                f"the Kafka cluster at {bootstrap} offers no SASL on that listener ({text}): "
                "connect to its SASL listener, or with security.protocol=PLAINTEXT and no "
                f"sasl.* settings, in {_CONFIG_WHERE}"
            )
        return (
            f"the Kafka cluster at {bootstrap} does not offer SASL {wanted} ({text}): set "
            f"sasl.mechanism to one it offers ({offered}) in {_CONFIG_WHERE}"
        )
    if error.code() == KafkaError._AUTHENTICATION:
        return (
            f"the Kafka cluster at {bootstrap} refused authentication ({text}): fix "
            f"sasl.username / sasl.password (AGENTS_STREAM_KAFKA_SASL_PASSWORD) or "
            f"sasl.mechanism in {_CONFIG_WHERE}"
        )
    if error.code() == KafkaError._SSL:
        return (
            f"TLS with the Kafka cluster at {bootstrap} failed ({text}): fix ssl.ca.location "
            f"(the CA that signed the broker's certificate) in {_CONFIG_WHERE}, and check "
            "that the certificate names this host"
        )
    return None


# What an authorizer answers (ACLs): the principal may not do that; retrying cannot help.
AUTHORIZATION_ERRORS = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)
_DELIVERY = re.compile(r"^delivery to (\S+) failed")
_READING = re.compile(r"^reading '?([^'\[\s]+)")


def principal() -> str:
    """``User:NAME`` of the SASL login configured (what ACLs name), else a description."""
    user = common_config().get("sasl.username")
    return f"User:{user}" if user else "this client's principal"


def denied(refused: str, grant: str) -> str:
    """One line: what the cluster's authorizer refused, and the ACL to grant."""
    return (
        f"the Kafka cluster refused {principal()} {refused}: grant it {grant} "
        "(`agents-stream acls -A module:app` prints every ACL the app needs)"
    )


def denial(exc: BaseException) -> str | None:
    """:func:`denied`'s line for a KafkaIOError an authorizer caused, else None."""
    code = getattr(exc, "code", None)
    if not isinstance(exc, KafkaIOError) or code not in AUTHORIZATION_ERRORS:
        return None
    text = str(exc)
    if text.startswith("the Kafka cluster refused"):
        return text  # said already
    delivery = _DELIVERY.match(text)
    if delivery is not None and code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return denied(f"a write to topic {delivery[1]} ({text})", f"Write on topic {delivery[1]}")
    reading = _READING.match(text)
    if reading is not None and code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        # Readers that assign partitions still look up their throwaway group's coordinator.
        return denied(
            f"a reader of {reading[1]} ({text})",
            "Describe on the groups prefixed agents-stream- (the readers' throwaway groups)",
        )
    if reading is not None and code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return denied(f"reading {reading[1]} ({text})", f"Read and Describe on topic {reading[1]}")
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return denied(
            f"a transactional producer ({text})",
            "Write and Describe on the transactional ids prefixed with the app id and -",
        )
    return denied(f"an operation ({text})", "the ACL it names")


REACH_TIMEOUT = 10.0
"""How long a command waits for the cluster to answer before saying it cannot reach it
(the worker's start-up budget: a dead broker is one line within seconds, whatever a
command's own ``--timeout`` allows for reading)."""


class StartupCancelled(Exception):
    """A stop was requested while waiting for the cluster."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    replication: int = -1  # broker default


def compacted(
    name: str, partitions: int, replication: int = -1, min_insync: int | None = None
) -> TopicSpec:
    config = {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "60000",
        "segment.ms": "3600000",
    }
    if min_insync is not None:
        config["min.insync.replicas"] = str(min_insync)
    return TopicSpec(name, partitions, config, replication)


class TopicAdmin:
    """Admin operations bounded by ``timeout`` seconds each.

    Args:
        bootstrap: bootstrap servers.
        timeout: how long the cluster may take to answer before KafkaIOError.
        cancel: set from another thread (a signal handler) to abandon a wait at once
            (raises StartupCancelled).
    """

    def __init__(
        self, bootstrap: str, timeout: float = 10.0, *, cancel: threading.Event | None = None
    ) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout
        self._cancel = cancel
        self._client: AdminClient | None = None
        self._refused: str | None = None

    def _on_error(self, error: KafkaError) -> None:
        self._refused = self._refused or refusal(error, self._bootstrap)

    @property
    def client(self) -> AdminClient:
        if self._client is None:
            try:
                self._client = AdminClient(
                    admin_config(self._bootstrap, {"error_cb": self._on_error})
                )
            except KafkaException as exc:
                raise ConfigurationError(
                    f"Kafka client configuration rejected: {scrub(exc.args[0].str())}; fix "
                    "--kafka-config, AGENTS_STREAM_KAFKA_* or App(kafka_config)"
                ) from exc
        return self._client

    def _metadata(self) -> object:
        client = self.client  # a rejected configuration fails here, not after the timeout
        # Short slices so a stop request is honoured within a fraction of a second.
        deadline = time.monotonic() + self._timeout
        while True:
            if self._cancel is not None and self._cancel.is_set():
                raise StartupCancelled()
            left = deadline - time.monotonic()
            try:
                return client.list_topics(timeout=max(0.05, min(0.5, left)))
            except KafkaException as exc:
                client.poll(0)  # serves error_cb: a refused login or certificate
                if self._refused is not None:  # is final: no use waiting out the timeout
                    raise KafkaIOError(self._refused, code=exc.args[0].code()) from exc
                if time.monotonic() >= deadline:
                    client.poll(0)  # hand librdkafka's log lines to Python logging
                    raise KafkaIOError(
                        f"cannot reach the Kafka cluster at {self._bootstrap} within "
                        f"{self._timeout:g}s ({exc.args[0].str()}): check --broker / "
                        "AGENTS_STREAM_BROKER and that the cluster is up and reachable",
                        code=exc.args[0].code(),
                    ) from exc

    def cluster_id(self) -> str | None:
        """The cluster id the brokers report (None when they report none)."""
        return getattr(self._metadata(), "cluster_id", None)

    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        md: Any = self._metadata()
        return {
            t: len(md.topics[t].partitions)
            for t in topics
            if t in md.topics and md.topics[t].partitions
        }

    def topic_config(self, topic: str) -> dict[str, str]:
        """The topic's effective configuration as the broker reports it."""
        return self._describe("topic", topic)

    def _describe(self, kind: str, name: str) -> dict[str, str]:
        futures = self.client.describe_configs(
            [ConfigResource(kind, name)], request_timeout=self._timeout
        )
        try:
            (entries,) = (f.result() for f in futures.values())
        except KafkaException as exc:
            raise KafkaIOError(
                f"cannot describe {kind} {name}: {exc.args[0].str()}", code=exc.args[0].code()
            ) from exc
        return {k: v.value for k, v in entries.items() if v.value is not None}

    def broker_config(self) -> dict[str, str]:
        """The configuration one broker of the cluster reports (cluster-wide settings such
        as the group coordinator's are the same on every broker of a healthy cluster)."""
        md: Any = self._metadata()
        if not md.brokers:
            raise KafkaIOError(f"no broker in the metadata of {self._bootstrap}")
        return self._describe("broker", str(min(md.brokers)))

    def ensure(self, specs: list[TopicSpec]) -> dict[str, int]:
        """Create the missing topics; return the partition count of every topic."""
        existing = self.partition_counts([s.name for s in specs])
        missing = [s for s in specs if s.name not in existing]
        if missing:
            futures = self.client.create_topics(
                [NewTopic(s.name, s.partitions, s.replication, config=s.config) for s in missing],
                operation_timeout=self._timeout,
            )
            for name, fut in futures.items():
                try:
                    fut.result()
                    log.info("created topic %s", name)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise KafkaIOError(
                            f"cannot create topic {name}: {exc.args[0].str()}; create it "
                            "yourself or fix the cause (--replication-factor larger than the "
                            "cluster, missing CREATE permission)",
                            code=exc.args[0].code(),
                        ) from exc
        for s in specs:
            existing.setdefault(s.name, s.partitions)
        return existing
