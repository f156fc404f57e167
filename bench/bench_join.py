"""How long a second worker takes to get partitions from a live one (issue 67, item 7).

One broker (the embedded one, or Apache Kafka 4.1.1 from Maven Central jars); per try a
fresh app whose input has 4 partitions; worker 1 starts and reports ready, then worker 2
starts. Printed per try, from worker 2's log: process start -> its "joining consumer
group" line -> its "assigned" line (partitions taken over from worker 1, cache rebuilt).

    .venv/bin/python bench/bench_join.py --broker embedded --tries 3
    JAVA_TOOL_OPTIONS= .venv/bin/python bench/bench_join.py --broker kafka --tries 3

Client settings are the worker's own; AGENTS_STREAM_KAFKA_* variables override them
(AGENTS_STREAM_KAFKA_HEARTBEAT_INTERVAL_MS=500, say) to see what each one costs.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from agents_stream.testing.process import WorkerProcess
from agents_stream.testing.topics import create_topics

ROOT = Path(__file__).resolve().parents[1]
APP = "tests.apps.dlq_app:app"  # one input, no calls needed: only the group matters
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]")


def _stamp(line: str) -> float | None:
    found = _STAMP.match(line)
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _line_at(worker: WorkerProcess, text: str, timeout: float = 120.0) -> float:
    """When ``worker`` logged its first line containing ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in worker.log().splitlines():
            at = _stamp(line) if text in line else None
            if at is not None:
                return at
        time.sleep(0.05)
    raise TimeoutError(f"no {text!r} line in {timeout:g}s:\n{worker.log()[-2000:]}")


def _broker(kind: str, base: Path) -> Any:
    if kind == "embedded":
        from agents_stream.testing import EmbeddedBroker

        return EmbeddedBroker().start()
    from agents_stream.testing.kafka import KafkaBroker

    return KafkaBroker(data_dir=base / "kafka", log_file=base / "kafka.log").start()


def measure(kind: str, tries: int) -> list[tuple[float, float]]:
    """Per try: (process start -> joining, joining -> assigned) of the second worker."""
    base = Path(tempfile.mkdtemp(prefix="bench-join-"))
    broker = _broker(kind, base)
    out: list[tuple[float, float]] = []
    try:
        for n in range(tries):
            env = {
                "AS_APP_ID": f"join{n}",
                "AS_INPUT": f"join-in-{n}",
                "AS_OUTPUT": f"join-out-{n}",
            }
            create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=4)
            first, second = (
                WorkerProcess(
                    APP,
                    broker=broker.url,
                    data_dir=base / f"data-{n}-{w}",
                    log_file=base / f"worker-{n}-{w}.log",
                    env=env,
                    cwd=ROOT,
                    extra_args=["--worker-id", f"w{w}"],
                )
                for w in (1, 2)
            )
            first.start()
            _line_at(first, "ready")
            time.sleep(2.0)  # worker 1 settled: heartbeating, nothing pending
            started = time.time()
            second.start()
            joining = _line_at(second, "joining consumer group")
            assigned = _line_at(second, "assigned ")
            out.append((joining - started, assigned - joining))
            print(
                f"{kind} try {n + 1}: start -> joining {joining - started:.2f} s, "
                f"joining -> assigned {assigned - joining:.2f} s",
                flush=True,
            )
            for worker in (second, first):
                worker.terminate()
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=["embedded", "kafka"], default="embedded")
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()
    runs = measure(args.broker, args.tries)
    joins = [j for _, j in runs]
    print(
        f"{args.broker}: joining -> assigned median {statistics.median(joins):.2f} s "
        f"(min {min(joins):.2f}, max {max(joins):.2f}; {len(joins)} tries)"
    )


if __name__ == "__main__":
    main()
