"""What the console's overview reads of the cluster: per input partition the group's
committed offset and the end offset (lag), dead letters per DLQ topic, and the workers'
metrics endpoints. Read-only: the group's offsets are looked up, never committed (the
consumer used never subscribes, so it never joins the workers' group)."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass

from ..app import App
from ..kafka.config import reader_config
from ..kafka.ends import read_ends


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None  # None: the group committed nothing here yet
    end: int
    owner: str = ""  # the group member it is assigned to ("" : none, or not known)

    @property
    def lag(self) -> int:
        # Never negative: a committed offset past the end read (a broker's wrong end, a
        # partition's end read a moment before its offsets) is no lag.
        return max(0, self.end - (self.committed if self.committed is not None else 0))


@dataclass(frozen=True)
class Overview:
    partitions: list[PartitionLag]
    dead_letters: dict[str, int | None]  # DLQ topic -> records (None: no such topic)
    errors: list[str]


def read_overview(app: App, bootstrap: str, *, timeout: float = 5.0) -> Overview:
    """Committed offsets of the group ``app.id`` and end offsets of every input, and the
    size of every ``<input>-dlq``. Ends are high watermarks as fetches report them
    (kafka/ends.py: the embedded broker's ListOffsets is short after a batched produce)."""
    from confluent_kafka import Consumer, TopicPartition

    errors: list[str] = []
    consumer = Consumer(
        reader_config(
            bootstrap,
            {"group.id": app.id, "log_level": 0, "isolation.level": "read_uncommitted"},
        )
    )
    try:
        wanted: list[TopicPartition] = []
        topics = list(app.input_topics)
        dlqs = [f"{t}-dlq" for t in topics]
        meta = consumer.list_topics(timeout=timeout).topics
        for topic in topics:
            found = meta.get(topic)
            if found is None or found.error is not None:
                errors.append(f"input topic {topic!r} not found")
                continue
            wanted += [TopicPartition(topic, p) for p in sorted(found.partitions)]
        committed = consumer.committed(wanted, timeout=timeout) if wanted else []
        owners = _owners(bootstrap, app.id, timeout, errors)
        letters: dict[str, int | None] = {}
        present = [d for d in dlqs if meta.get(d) is not None and meta[d].error is None]
        dead = [(d, p) for d in present for p in sorted(meta[d].partitions)]
        ends = read_ends(
            consumer, [(tp.topic, tp.partition) for tp in committed] + dead, timeout=timeout
        )
        lags = []
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else None
            owner = owners.get((tp.topic, tp.partition), "")
            end = ends[(tp.topic, tp.partition)]
            lags.append(PartitionLag(tp.topic, tp.partition, offset, end, owner))
        for dlq in dlqs:
            if dlq not in present:
                letters[dlq] = None
                continue
            total = 0
            for p in meta[dlq].partitions:
                low, _ = consumer.get_watermark_offsets(TopicPartition(dlq, p), timeout=timeout)
                total += max(0, ends[(dlq, p)] - low)
            letters[dlq] = total
        return Overview(lags, letters, errors)
    finally:
        consumer.close()


def _owners(
    bootstrap: str, group: str, timeout: float, errors: list[str]
) -> dict[tuple[str, int], str]:
    """(topic, partition) -> ``client id@host`` of the member of ``group`` it is
    assigned to; {} (and a line in ``errors``) when the broker cannot describe groups."""
    from confluent_kafka.admin import AdminClient

    from ..kafka.config import admin_config

    try:
        admin = AdminClient(admin_config(bootstrap))
        [group_info] = [f.result(timeout) for f in admin.describe_consumer_groups([group]).values()]
    except Exception as exc:  # shown, not fatal
        errors.append(f"owners unknown: the group {group!r} cannot be described ({exc})")
        return {}
    owners: dict[tuple[str, int], str] = {}
    for member in group_info.members:
        assignment = member.assignment
        for tp in assignment.topic_partitions if assignment is not None else ():
            owners[(tp.topic, tp.partition)] = f"{member.client_id}@{member.host}"
    return owners


class MetricsScraper:
    """The workers' Prometheus endpoints (``worker --metrics-port``): each scrape keeps the
    ``agents_stream_*`` samples, and rates come from two scrapes' difference."""

    # What the overview shows of each (runtime/metrics.py names them).
    WATCHED = (
        "agents_stream_records_total",
        "agents_stream_calls_executed_total",
        "agents_stream_calls_replayed_total",
        "agents_stream_in_flight",
    )

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._last: dict[str, tuple[float, dict[str, float]]] = {}

    def scrape(self, url: str, timeout: float = 3.0) -> dict[str, float]:
        """Sums per metric name (over labels) of one endpoint."""
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            text = answer.read().decode()
        sums: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("agents_stream_"):
                continue
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            try:
                sums[name] = sums.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return sums

    def rates(self) -> list[tuple[str, dict[str, float], dict[str, float], str]]:
        """Per endpoint: its sums, per-second rates of its counters since the previous
        call, and an error ("" when it answered)."""
        out: list[tuple[str, dict[str, float], dict[str, float], str]] = []
        for url in self.urls:
            try:
                sums = self.scrape(url)
            except Exception as exc:  # an unreachable worker is shown, not fatal
                out.append((url, {}, {}, f"{type(exc).__name__}: {exc}"))
                continue
            now = time.monotonic()
            rates: dict[str, float] = {}
            previous = self._last.get(url)
            if previous is not None and now > previous[0]:
                elapsed = now - previous[0]
                for name, value in sums.items():
                    if name.endswith("_total") and name in previous[1]:
                        rates[name] = max(0.0, value - previous[1][name]) / elapsed
            self._last[url] = (now, sums)
            out.append((url, sums, rates, ""))
        return out
