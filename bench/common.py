"""Helpers shared by the bench scripts: quick mode, topics, percentiles, tables.

Benches are run as scripts (``python bench/bench_x.py``), so this module is imported as
``common`` from the script's own directory, never as a package.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Iterable, Sequence

from agents_stream.kafka.admin import TopicAdmin, TopicSpec, compacted

QUICK_ENV = "AGENTS_STREAM_BENCH_QUICK"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with ``--quick`` (also on when AGENTS_STREAM_BENCH_QUICK=1)."""
    p = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get(QUICK_ENV, "") not in ("", "0"),
        help=f"moderate sizes for `make bench` (or set {QUICK_ENV}=1)",
    )
    return p


def create_topic(bootstrap: str, name: str, partitions: int, *, compact: bool = False) -> None:
    spec = compacted(name, partitions) if compact else TopicSpec(name, partitions)
    TopicAdmin(bootstrap).ensure([spec])


def produce_all(bootstrap: str, topic: str, records: Iterable[tuple[int, bytes, bytes]]) -> int:
    """Produce ``(partition, key, value)`` records as fast as the producer takes them,
    waiting out a full queue; returns the records' bytes (keys + values)."""
    from confluent_kafka import Producer

    from agents_stream.kafka.config import producer_config

    settings = {"linger.ms": 50, "queue.buffering.max.messages": 1_000_000}
    producer = Producer(producer_config(bootstrap, {**settings, "enable.idempotence": False}))
    size = 0
    for n, (partition, key, value) in enumerate(records):
        size += len(key) + len(value)
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
        if n % 5_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0, "records left unsent"
    return size


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``; 0.0 when there are none."""
    if not samples:
        return 0.0
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[min(max(int(q), 1), 99) - 1]


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in header], *[[_fmt(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: list[str]) -> str:
        first = r[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))])

    out = [line(cells[0]), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
