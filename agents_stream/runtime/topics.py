"""The topics a worker reads and writes: names checked before any I/O, created when
missing, and the ActionState topic's and the cluster's fitness checked at start-up."""

from __future__ import annotations

import logging

from ..app import App
from ..errors import ConfigurationError, KafkaIOError
from ..kafka.admin import TopicAdmin, TopicSpec, compacted, validate_topic_names

log = logging.getLogger("agents_stream.worker")


def worker_topics(app: App) -> list[str]:
    """Every topic a worker of ``app`` reads or writes."""
    topics = list(app.input_topics) + [f"{t}-dlq" for t in app.input_topics]
    topics += [b.output for b in app.agents if b.output] + [b.output for b in app.async_ios]
    if app.agents:
        topics.append(app.action_state_topic)
    return topics


def check_topic_settings(app: App) -> None:
    """Raise ConfigurationError for topic names or replication settings Kafka would
    reject (no I/O)."""
    validate_topic_names(worker_topics(app))
    rf, isr = app.replication_factor, app.min_insync_replicas
    if rf == 0 or rf < -1:
        raise ConfigurationError(
            f"replication factor {rf} is invalid: use -1 (the broker's default) or >= 1"
        )
    if isr is not None and (isr < 1 or (rf > 0 and isr > rf)):
        raise ConfigurationError(
            f"min.insync.replicas {isr} is invalid for replication factor {rf}: use "
            "1 <= min.insync.replicas <= replication factor"
        )


def ensure_topics(admin: TopicAdmin, app: App, broker: str) -> dict[str, int]:
    """Create what is missing; returns each topic's partition count. The ActionState
    topic has as many partitions as the widest agent input (a record's journal lives in
    its input partition's number) and is compacted; each input has a dead-letter topic."""
    inputs = app.input_topics
    rf = app.replication_factor
    counts = admin.ensure([TopicSpec(t, app.partitions, replication=rf) for t in inputs])
    state_partitions = max(counts[b.input] for b in app.agents) if app.agents else 1
    outputs = [b.output for b in app.agents if b.output] + [b.output for b in app.async_ios]
    state = compacted(app.action_state_topic, state_partitions, rf, app.min_insync_replicas)
    counts.update(
        admin.ensure(
            [TopicSpec(t, app.partitions, replication=rf) for t in outputs]
            + [TopicSpec(f"{t}-dlq", counts[t], replication=rf) for t in inputs]
            + ([state] if app.agents else [])
        )
    )
    if app.agents:
        _check_action_state(admin, app, counts)
    if app.exactly_once:
        _check_transactions(admin, broker)
    return counts


def _check_action_state(admin: TopicAdmin, app: App, counts: dict[str, int]) -> None:
    """An existing ActionState topic must be co-partitioned with every agent input and
    compacted (the journal of a live key must never expire)."""
    topic = app.action_state_topic
    for b in app.agents:
        if counts[topic] < counts[b.input]:
            raise ConfigurationError(
                f"ActionState topic {topic} has {counts[topic]} partitions but input "
                f"{b.input} has {counts[b.input]}: give {topic} at least "
                f"{counts[b.input]} partitions (kafka-topics --alter) or use a new app id"
            )
    try:
        policy = admin.topic_config(topic).get("cleanup.policy", "")
    except KafkaIOError as exc:  # e.g. no DescribeConfigs permission: cannot tell
        log.warning("cannot verify that %s is compacted (%s); make sure it is", topic, exc)
        return
    if "compact" not in policy.split(","):
        raise ConfigurationError(
            f"ActionState topic {topic} has cleanup.policy={policy or 'unset'}: set "
            f"cleanup.policy=compact on it (kafka-configs --alter --add-config "
            "cleanup.policy=compact)"
        )


def _check_transactions(admin: TopicAdmin, broker: str) -> None:
    """Exactly-once needs isolating transactions; the embedded broker's are not (its
    ``read_committed`` readers see aborted records), so it is refused, not trusted."""
    cluster = admin.cluster_id() or ""
    if cluster.startswith("tansu"):
        raise ConfigurationError(
            f"processing_guarantee=exactly_once needs Apache Kafka: the broker at "
            f"{broker} is the embedded one (cluster {cluster!r}), whose "
            "transactions do not hide aborted records; use --processing-guarantee "
            "at-least-once with it"
        )
