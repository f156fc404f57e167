"""Which consumer group protocol a worker speaks: KIP-848's ``consumer`` or ``classic``.

Why it matters: under the classic protocol a member whose coordinator moves (a broker
restart, a leader election of ``__consumer_offsets``) may see its session expire and lose
its partitions without a revoke; its in-flight records are abandoned and their
unacknowledged calls run again on the next owner. KIP-848 (``group.protocol=consumer``,
Apache Kafka 4.0+) keeps the member's assignment on the server with member epochs, so a
coordinator move does not cost members their partitions, and rebalances are incremental
without a client-side assignor.

Choice, at start-up (``--group-protocol``, default ``classic``; logged either way). Both
pass the three-node cluster's faults in both guarantees (tests/fault/test_cluster.py),
and ``consumer`` loses no partition on a coordinator move where ``classic`` loses a few.
``classic`` stays the default for its session: the client sets it (6 s here), where with
``consumer`` the broker does, 45 s by default and no lower than the broker's
``group.consumer.min.session.timeout.ms`` (45 s too). A member cut off from the cluster
learns of it only at its freeze limit (the session less one and a half heartbeats:
37.5 s against 3.75 s) and starts code blocks until then; a dead member's partitions wait out the
session. Opt in where the brokers' group session is set short.

1. ``classic`` (asked for, or not asked): the client settings stand
   (``session.timeout.ms`` 6 s, cooperative-sticky).
2. ``consumer``: the cluster's configuration is described: a broker whose
   ``group.coordinator.rebalance.protocols`` lists ``consumer`` supports it. librdkafka
   then refuses ``session.timeout.ms``, ``heartbeat.interval.ms`` and
   ``partition.assignment.strategy`` (the broker decides them), so they are dropped, and
   the freeze limit (``watchdog.freeze_after``) comes from the broker's
   ``group.consumer.session.timeout.ms`` and ``group.consumer.heartbeat.interval.ms``
   (45 s and 5 s by default: a member frozen or cut off is noticed after ~37 s, not 3.75).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigurationError, KafkaIOError
from ..kafka.admin import TopicAdmin

log = logging.getLogger("agents_stream.worker")

GroupProtocolName = Literal["consumer", "classic"]
# The broker's defaults (Apache Kafka 4.x) when its configuration cannot be read.
CONSUMER_SESSION_MS = 45000
CONSUMER_HEARTBEAT_MS = 5000
# Refused by librdkafka with group.protocol=consumer: the broker decides them.
_BROKER_SIDE = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


@dataclass(frozen=True)
class GroupProtocol:
    name: GroupProtocolName
    session_ms: int
    heartbeat_ms: int
    why: str  # for the start-up line

    @property
    def timing(self) -> dict[str, int]:
        """``session.timeout.ms`` / ``heartbeat.interval.ms`` as they apply to this member
        (for ``freeze_after``), whichever side sets them."""
        return {"session.timeout.ms": self.session_ms, "heartbeat.interval.ms": self.heartbeat_ms}

    def announce(self, group: str) -> None:
        """The start-up line (issue 54): a worker is otherwise silent until the group
        assigns it partitions, which after a crash takes the dead member's session."""
        log.info(
            "joining consumer group %s with the %s group protocol (%s): partitions come "
            "once the group rebalances (a member that died without leaving holds its "
            "partitions until its session expires, session timeout %d ms)",
            group,
            self.name,
            self.why,
            self.session_ms,
        )


def choose_group_protocol(
    admin: TopicAdmin, requested: GroupProtocolName | None, conf: dict[str, Any]
) -> GroupProtocol:
    """Decide the protocol and set ``conf`` (a consumer configuration) for it."""
    if conf.get("group.protocol") and requested is None:
        requested = str(conf["group.protocol"]).lower()  # type: ignore[assignment]
    if requested not in (None, "consumer", "classic"):
        raise ConfigurationError(f"group.protocol {requested!r}: use consumer or classic")
    if requested == "classic":
        conf["group.protocol"] = "classic"
        return _classic(conf, "asked for")
    if requested is None:
        return _classic(conf, "the default; --group-protocol consumer opts in to KIP-848")
    try:
        broker = admin.broker_config()
    except KafkaIOError as exc:  # e.g. no DescribeConfigs on the cluster
        if requested == "consumer":
            log.warning(
                "cannot read the broker's group settings (%s): assuming its defaults "
                "(group.consumer.session.timeout.ms=%d)",
                exc,
                CONSUMER_SESSION_MS,
            )
            return _consumer(conf, {}, "asked for")
        return _classic(conf, f"the cluster's group protocols are unknown ({exc})")
    protocols = broker.get("group.coordinator.rebalance.protocols", "classic")
    supported = "consumer" in [p.strip() for p in protocols.split(",")]
    if requested == "consumer" and not supported:
        raise ConfigurationError(
            f"--group-protocol consumer: the cluster does not support it "
            f"(group.coordinator.rebalance.protocols={protocols}); use --group-protocol "
            "classic or a broker of Apache Kafka 4.0+"
        )
    if not supported:
        return _classic(conf, f"the cluster supports only {protocols}")
    return _consumer(conf, broker, "asked for" if requested else "the cluster supports it")


def _classic(conf: dict[str, Any], why: str) -> GroupProtocol:
    session = int(conf.get("session.timeout.ms", 45000))
    heartbeat = int(conf.get("heartbeat.interval.ms", 3000))
    return GroupProtocol("classic", session, heartbeat, why)


def _consumer(conf: dict[str, Any], broker: dict[str, str], why: str) -> GroupProtocol:
    conf["group.protocol"] = "consumer"
    dropped = [k for k in _BROKER_SIDE if conf.pop(k, None) is not None]
    session = int(broker.get("group.consumer.session.timeout.ms", CONSUMER_SESSION_MS))
    heartbeat = int(broker.get("group.consumer.heartbeat.interval.ms", CONSUMER_HEARTBEAT_MS))
    if dropped:
        why += f"; {', '.join(dropped)} are the broker's to set"
    return GroupProtocol("consumer", session, heartbeat, why)
