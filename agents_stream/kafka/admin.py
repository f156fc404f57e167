"""Topic creation: inputs, outputs, DLQs and the compacted ActionState topic."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ..errors import KafkaIOError

log = logging.getLogger("agents_stream.kafka")


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    replication: int = -1  # broker default


def compacted(name: str, partitions: int) -> TopicSpec:
    return TopicSpec(
        name,
        partitions,
        {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000", "segment.ms": "3600000"},
    )


class TopicAdmin:
    def __init__(self, bootstrap: str, timeout: float = 15.0) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout
        self._client: AdminClient | None = None

    @property
    def client(self) -> AdminClient:
        if self._client is None:
            self._client = AdminClient({"bootstrap.servers": self._bootstrap, "log_level": 3})
        return self._client

    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        try:
            md = self.client.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise KafkaIOError(f"cannot reach {self._bootstrap}: {exc}") from exc
        return {
            t: len(md.topics[t].partitions)
            for t in topics
            if t in md.topics and md.topics[t].partitions
        }

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
                            f"cannot create topic {name}: {exc}", code=exc.args[0].code()
                        ) from exc
        for s in specs:
            existing.setdefault(s.name, s.partitions)
        return existing
