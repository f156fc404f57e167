"""What the multi-worker fault tests share: a steady input feed, a tail of the outputs,
and the check every fault test ends with: the workers it did not kill are alive, logged
no CRITICAL line, and made outputs in the last seconds (alive is not enough: issue 50's
worker hung in a librdkafka call, alive and silent, with nothing committed).

Outputs are the failover app's (tests/apps/failover_app.py): ``{"n", "pid", "t"}``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from agents_stream.testing.topics import Inputs


@dataclass(frozen=True)
class Out:
    n: int
    partition: int
    pid: int
    t: float


class Feeder(threading.Thread):
    """Produces ``n`` to partition ``n % partitions`` (key ``p<p>-k<j>``) at a steady
    rate, from an idempotent producer: a retried batch must not duplicate inputs, or it
    looks like a re-run."""

    def __init__(
        self, bootstrap: str, topic: str, *, partitions: int = 6, interval: float = 0.15
    ) -> None:
        super().__init__(daemon=True)
        self.producer = Inputs(bootstrap)
        self.topic = topic
        self.partitions = partitions
        self.interval = interval
        self.sent = 0
        self.stop = threading.Event()
        self.failed: Exception | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for _ in range(self.partitions):
                    n = self.sent
                    p = n % self.partitions
                    key = f"p{p}-k{(n // self.partitions) % 3}"
                    self.producer.send(self.topic, f'{{"n": {n}}}'.encode(), key, partition=p)
                    self.sent += 1
                time.sleep(self.interval)
        except Exception as exc:  # kept for finish(): a dead feeder looks like idle workers
            self.failed = exc
            return
        try:
            self.producer.close(60)
        except RuntimeError as exc:
            self.failed = exc

    def finish(self) -> int:
        """Stop feeding; how many inputs were sent (all acknowledged, or it raises: an
        input that never reached the topic is not a record the workers lost)."""
        self.stop.set()
        self.join(90)
        assert not self.is_alive(), "the feeder did not stop"
        if self.failed is not None:
            raise self.failed
        return self.sent


class Tail(threading.Thread):
    """Collects every output record as it arrives (``read_committed``: librdkafka's
    default, so an exactly-once worker's aborted outputs are never seen)."""

    def __init__(self, bootstrap: str, topic: str, *, partitions: int = 6) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.outs: list[Out] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "tail",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                # Not the default "latest": a position found invalid after a leader change
                # (a whole-cluster restart) would skip to the end, and skipped outputs
                # would read as lost inputs.
                "auto.offset.reset": "earliest",
            }
        )
        md: Any = None
        while not self.stop.is_set():
            md = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if md is not None and md.partitions:
                break
            time.sleep(0.2)
        consumer.assign([TopicPartition(self.topic, p, 0) for p in md.partitions])
        while not self.stop.is_set():
            for msg in consumer.consume(500, 0.1):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(err))  # an assert would end the thread
                    continue
                v = json.loads(msg.value())
                self.outs.append(Out(v["n"], v["n"] % self.partitions, v["pid"], v["t"]))
        consumer.close()

    def pids_since(self, since: float) -> set[int]:
        return {o.pid for o in list(self.outs) if o.t >= since}

    def owners(self, since: float) -> dict[int, set[int]]:
        """Input partition -> pids that produced its outputs after ``since``."""
        owners: dict[int, set[int]] = {}
        for o in list(self.outs):
            if o.t >= since:
                owners.setdefault(o.partition, set()).add(o.pid)
        return owners

    def wait_for(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` distinct inputs came out (or the timeout)."""
        deadline = time.monotonic() + timeout
        while len({o.n for o in self.outs}) < count and time.monotonic() < deadline:
            time.sleep(0.5)

    def finish(self) -> list[Out]:
        self.stop.set()
        self.join(30)
        return list(self.outs)


def logs(workers: Iterable[Any], chars: int = 3000) -> str:
    return "\n".join(f"--- {w.log_file}\n{w.log()[-chars:]}" for w in workers)


def lost_report(lost: list[int], topic: str, workers: Iterable[Any], *, partitions: int = 6) -> str:
    """Why inputs may be missing, for a failing assertion: their partitions (input ``n``
    goes to ``n % partitions``) and what each worker logged about those partitions, with
    every WARNING or ERROR line (CI shows only the assertion's message)."""
    parts = sorted({n % partitions for n in lost})
    names = tuple(f"{topic}[{p}]" for p in parts)
    out = [f"lost {lost[:20]} (of {len(lost)}) in partitions {parts}"]
    for w in workers:
        lines = [
            line
            for line in w.log().splitlines()
            if any(name in line for name in names) or " WARNING " in line or " ERROR " in line
        ]
        out.append(f"--- {w.log_file}: {len(lines)} lines\n" + "\n".join(lines[-60:]))
    return "\n".join(out)


def stacks(workers: Iterable[Any]) -> str:
    """Every thread's stack in each worker still running (py-spy, when installed): what a
    worker that stopped making progress waits on, for a failing assertion."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = []
    for w in workers:
        if w.proc is None or not w.alive:
            continue
        try:
            dump = subprocess.run(
                [spy, "dump", "--pid", str(w.proc.pid)],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            text = dump.stdout or dump.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"no stacks: {exc}"
        out.append(f"--- stacks of {w.log_file}\n{text}")
    return "\n".join(out)


def critical_lines(worker: Any) -> list[str]:
    return [line for line in worker.log().splitlines() if "CRITICAL" in line]


def assert_survivors(workers: Iterable[Any], *, quiet_ok: bool = False) -> None:
    """Every worker the test did not kill is running and logged no CRITICAL line."""
    workers = list(workers)
    for w in workers:
        assert w.alive, f"a worker the test did not kill has stopped\n{logs([w])}"
        assert not critical_lines(w), f"CRITICAL logged\n{logs([w])}"


def assert_progress(tail: Tail, workers: Iterable[Any], seconds: float = 5.0) -> None:
    """Every worker in ``workers`` made an output within the last ``seconds``: alive and
    making progress (with partitions of its own)."""
    workers = list(workers)
    recent = tail.pids_since(time.time() - seconds)
    idle = [w for w in workers if w.proc is not None and w.proc.pid not in recent]
    assert not idle, f"no output in the last {seconds:.0f}s from\n{logs(idle)}"
