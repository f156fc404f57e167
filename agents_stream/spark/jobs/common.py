"""What every Spark job shares: progress reporting and small Kafka metadata look-ups.

Progress is shown three ways: log lines (``agents_stream.spark.jobs``) with the wall
time of each step; records done / total, rate and ETA while a step that reads topics
runs (:mod:`.progress`); and the Spark job group/description of the step, so the Spark
UI (or the history server) names every Spark job after the step that ran it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ...errors import KafkaIOError
from ...kafka.admin import TopicAdmin
from ...kafka.config import reader_config
from ..errors import MissingTopicError
from .progress import StepProgress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("agents_stream.spark.jobs")


@contextmanager
def step(
    spark: SparkSession, job: str, description: str, *, records: int | None = None
) -> Iterator[None]:
    """Names the Spark jobs run inside the block and logs the step's start and duration.

    With ``records`` (what the step reads, e.g. from :func:`.progress.planned_records`)
    the step also reports records done / total, rate and ETA while it runs.
    """
    sc = spark.sparkContext
    group = f"agents-stream-{job}"
    sc.setJobGroup(group, f"{job}: {description}", interruptOnCancel=True)
    log.info("%s: %s ...", job, description)
    started = time.monotonic()
    try:
        if records is None:
            yield
        else:
            with StepProgress(spark, group, f"{job}: {description}", records):
                yield
    finally:
        log.info("%s: %s done in %.1fs", job, description, time.monotonic() - started)
        sc.setJobGroup(f"agents-stream-{job}", f"{job}", interruptOnCancel=True)


def partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Partition count of each existing topic among ``topics`` (missing ones left out)."""
    return TopicAdmin(bootstrap).partition_counts(topics)


def require_topics(bootstrap: str, topics: dict[str, str]) -> None:
    """Fails in one line when one of ``topics`` (name -> what it is to the job) is missing.

    Raises:
        MissingTopicError: the first missing topic, named with what it is.
    """
    counts = partition_counts(bootstrap, list(topics))
    for topic, what in topics.items():
        if topic not in counts:
            raise MissingTopicError(
                f"topic {topic!r} does not exist on {bootstrap}: it is {what}; check -A and "
                "--broker (or run the app's worker once, which creates its topics)"
            )


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Offsets the consumer group ``group`` committed on ``topic`` (absent: none yet).

    Raises:
        KafkaIOError: the group coordinator could not be asked.
    """
    conf = reader_config(bootstrap, {"group.id": group})
    conf.setdefault("client.id", f"agents-stream-audit-{uuid.uuid4().hex[:8]}")
    consumer = Consumer(conf)
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    except KafkaException as exc:
        err = exc.args[0]
        raise KafkaIOError(
            f"cannot read offsets of group {group!r}: {err}", code=err.code()
        ) from exc
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
