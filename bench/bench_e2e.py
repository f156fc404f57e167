"""End to end: events/s of agents_stream workers vs raw loops, Quix Streams, Bytewax, Faust.

Every system drains the same backlog (``--records`` JSON records, 1,000 keys, 4
partitions, produced before it starts) from its own copy of the input topic into its own
output topic, on one embedded broker, in one run. The rate is outputs / span of the output
records' timestamps, so group joins and process start-up do not count; ``ratio`` is
against the raw confluent-kafka consume->produce loop of the same run, and for journaled
agents_stream rows also against the raw journal-before-output loop (``vs journal``).
For a single worker process the note says, from 10 % of the outputs to 90 %, the share its
event-loop thread ran on a CPU and the share it was runnable but queued for one (Linux
``schedstat``): together near 100 % the worker is CPU-bound on that thread (on this
2-core machine the broker and the other threads take a core from it now and then); well
below, it waits (for acks, the broker, other threads).

The two-process row is one ``agents-stream worker --processes 2`` command (a supervisor
and two worker processes in one group). Its workers are started first, and the backlog is
produced once their ``/metrics`` show every partition assigned: otherwise the second process's join (~3 s on
the embedded broker) lands in the middle of a drain of a few seconds, and the row
measures when it joined rather than how two processes share the work.

A system that cannot run here (peer not installed, crashed) is reported with its error and
the run goes on. Peers install with ``pip install -e '.[bench]'`` (``make bench`` does).

Run: ``.venv/bin/python bench/bench_e2e.py [--records 50000] [--only raw,agents] [--quick]``
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from common import create_topic, parser, table
from confluent_kafka import Consumer, Producer, TopicPartition

from agents_stream.kafka.admin import TopicAdmin, TopicSpec
from agents_stream.testing import EmbeddedBroker, free_port

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ROOT / "bench" / "e2e" / "systems.py"
PARTITIONS = 4
KEYS = 1000


@dataclass
class Variant:
    name: str
    system: str  # a systems.py name, or "agents"
    env: dict[str, str] = field(default_factory=dict)
    processes: int = 1
    journaled: bool = False
    args: list[str] = field(default_factory=list)  # extra worker CLI arguments


VARIANTS = [
    Variant("raw confluent-kafka consume->produce loop", "raw"),
    Variant("raw journal-before-output loop", "raw-journal", journaled=True),
    Variant("Quix Streams, stateless", "quix"),
    Variant("Quix Streams, one RocksDB state write per record", "quix-state"),
    Variant("Bytewax, stateless", "bytewax"),
    Variant("Bytewax, keyed state + recovery snapshots 1 s", "bytewax-state"),
    Variant("faust-streaming, plain agent", "faust"),
    Variant("faust-streaming, table update", "faust-table"),
    Variant("agents_stream, sync, 0 calls", "agents", {"AS_BENCH_CALLS": "0"}),
    Variant(
        "agents_stream, sync, 1 ctx.execute", "agents", {"AS_BENCH_CALLS": "1"}, journaled=True
    ),
    Variant(
        "agents_stream, sync, 3 ctx.execute", "agents", {"AS_BENCH_CALLS": "3"}, journaled=True
    ),
    Variant(
        "agents_stream, async, 1 ctx.execute_async",
        "agents",
        {"AS_BENCH_CALLS": "1", "AS_BENCH_KIND": "async"},
        journaled=True,
    ),
    Variant(
        "agents_stream, async, 3 ctx.execute_async",
        "agents",
        {"AS_BENCH_CALLS": "3", "AS_BENCH_KIND": "async"},
        journaled=True,
    ),
    Variant(
        "agents_stream, async, 1 ctx.execute (sync call)",
        "agents",
        {"AS_BENCH_CALLS": "1", "AS_BENCH_KIND": "async_inline"},
        journaled=True,
    ),
    Variant(
        "agents_stream, sync, 1 call, two processes",
        "agents",
        {"AS_BENCH_CALLS": "1"},
        processes=2,
        journaled=True,
    ),
]


def fill(bootstrap: str, topic: str, records: int) -> None:
    # An explicit retention: Quix sizes its changelog topics from the input's.
    TopicAdmin(bootstrap).ensure([TopicSpec(topic, PARTITIONS, {"retention.ms": "86400000"})])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 3})
    for i in range(records):
        key = f"k{i % KEYS}".encode()
        value = json.dumps({"id": i, "user": key.decode(), "amount": i % 97 + 0.5}).encode()
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)


def start(
    variant: Variant,
    bootstrap: str,
    topic_in: str,
    topic_out: str,
    tmp: Path,
    metrics_ports: list[int] | None = None,
) -> list[subprocess.Popen[bytes]]:
    py = sys.executable
    procs = []
    # agents_stream runs its processes under one command (worker --processes N).
    commands = 1 if variant.system == "agents" else variant.processes
    for n in range(commands):
        log = open(tmp / f"{variant.system}-{n}.log", "wb")  # noqa: SIM115 - lives with the process
        if variant.system == "agents":
            app_id = f"bench-{topic_in}"
            env = {
                **os.environ,
                **variant.env,
                "AS_BENCH_APP": app_id,
                "AS_BENCH_INPUT": topic_in,
                "AS_BENCH_OUTPUT": topic_out,
                "PYTHONPATH": str(ROOT),
            }
            cmd = [
                py, "-m", "agents_stream", "worker", "-A", "bench.e2e.as_app:app",
                "--broker", f"kafka://{bootstrap}", "--data-dir", str(tmp / f"data-{n}"),
                "-l", "warning",
            ]  # fmt: skip
            cmd += variant.args
            if variant.processes > 1:
                cmd += ["--processes", str(variant.processes)]
            if metrics_ports:  # consecutive: child i serves the first one + i
                cmd += ["--metrics-port", str(metrics_ports[0])]
        else:
            env = {**os.environ, **variant.env}
            state_topic = f"{topic_in}-journal"
            if variant.system == "raw-journal":
                create_topic(bootstrap, state_topic, PARTITIONS, compact=True)
            cmd = [
                py, str(SYSTEMS), variant.system, "--bootstrap", bootstrap,
                "--input", topic_in, "--output", topic_out, "--state-topic", state_topic,
            ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp))
    return procs


def free_ports(count: int) -> list[int]:
    """``count`` consecutive free ports (``worker --processes`` numbers them from one)."""
    for _ in range(100):
        base = free_port()
        ports = list(range(base, base + count))
        try:
            for port in ports[1:]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return ports
    raise RuntimeError(f"no {count} consecutive free ports")


def wait_assigned(ports: list[int], procs: list[subprocess.Popen[bytes]], timeout: float) -> str:
    """Waits until the workers' ``/metrics`` show every partition assigned and each
    worker owning some; returns an error, or "" once they do."""
    deadline = time.monotonic() + timeout
    owned: list[float] = []
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return "a worker exited before the group settled"
        owned = []
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                owned.append(0.0)
                continue
            owned.append(
                sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("agents_stream_assigned_partitions{")
                )
            )
        if sum(owned) == PARTITIONS and all(owned):
            return ""
        time.sleep(0.3)
    return f"group not settled after {timeout:.0f}s (partitions owned: {owned})"


def loop_cpu(proc: subprocess.Popen[bytes]) -> tuple[float, float] | None:
    """Seconds so far that ``proc``'s main thread, where a worker runs its event loop,
    spent on a CPU and runnable waiting for one (Linux schedstat); None without it."""
    try:
        running, queued, _ = Path(f"/proc/{proc.pid}/task/{proc.pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(running) / 1e9, int(queued) / 1e9


def collect(
    bootstrap: str,
    topic: str,
    expected: int,
    procs: list[subprocess.Popen[bytes]],
    timeout: float,
    watch: subprocess.Popen[bytes] | None = None,
) -> tuple[int, float, str, tuple[float, float] | None]:
    """Count outputs until ``expected`` arrived (or no progress / a process died). With
    ``watch`` (a worker process), also the shares of the wall time from 10 % of the
    outputs to 90 % that its event-loop thread ran, and waited for a CPU (runnable)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    stamps: list[int] = []
    deadline = time.monotonic() + timeout
    last_progress = time.monotonic()
    assigned = False
    error = ""
    first_cpu: tuple[float, tuple[float, float]] | None = None
    last_cpu: tuple[float, tuple[float, float]] | None = None
    try:
        while len(stamps) < expected and time.monotonic() < deadline:
            if not assigned:
                meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
                if meta is not None and meta.partitions:
                    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
                    assigned = True
                else:
                    time.sleep(0.5)
                    continue
            batch = consumer.consume(1000, 0.5)
            got = [m.timestamp()[1] for m in batch if not m.error()]
            if got:
                stamps += got
                last_progress = time.monotonic()
                # From 10 % of the outputs to 90 %: the drain's steady state, without
                # the start (fetching, first batches) and the tail (the last acks).
                cpu = loop_cpu(watch) if watch is not None else None
                if cpu is not None and len(stamps) >= expected // 10:
                    first_cpu = first_cpu or (last_progress, cpu)
                    if last_cpu is None or len(stamps) - len(got) < expected * 9 // 10:
                        last_cpu = (last_progress, cpu)
            elif stamps and time.monotonic() - last_progress > 30:
                error = f"stalled at {len(stamps)}/{expected}"
                break
            dead = [p for p in procs if p.poll() is not None]
            if dead and not got:
                error = f"exited with {dead[0].returncode} at {len(stamps)}/{expected}"
                break
        else:
            if len(stamps) < expected:
                error = f"timeout at {len(stamps)}/{expected}"
    finally:
        consumer.close()
    busy = None
    if first_cpu and last_cpu and last_cpu[0] > first_cpu[0]:
        wall = last_cpu[0] - first_cpu[0]
        busy = (
            (last_cpu[1][0] - first_cpu[1][0]) / wall,
            (last_cpu[1][1] - first_cpu[1][1]) / wall,
        )
    if len(stamps) < 2:
        return len(stamps), 0.0, error or "no output", busy
    span = (max(stamps) - min(stamps)) / 1000
    return len(stamps), len(stamps) / max(span, 1e-3), error, busy


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=0, help="backlog size (default 50k, quick 20k)")
    p.add_argument("--only", default="", help="comma-separated substrings of variant names")
    p.add_argument("--timeout", type=float, default=240, help="seconds per system")
    args = p.parse_args()
    records = args.records or (20_000 if args.quick else 50_000)
    wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    variants = [
        v
        for v in VARIANTS
        if not wanted or any(w in f"{v.name} {v.system}".lower() for w in wanted)
    ]
    rows: list[tuple[str, float, str]] = []
    loop_busy: dict[str, tuple[float, float]] = {}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp_dir:
        tmp = Path(tmp_dir)
        for i, variant in enumerate(variants):
            topic_in, topic_out = f"e2e-{i}-in", f"e2e-{i}-out"
            settle_first = variant.system == "agents" and variant.processes > 1
            fill(broker.bootstrap, topic_in, 0 if settle_first else records)
            create_topic(broker.bootstrap, topic_out, PARTITIONS)
            ports = free_ports(variant.processes) if settle_first else None
            procs = start(variant, broker.bootstrap, topic_in, topic_out, tmp, ports)
            try:
                error = wait_assigned(ports, procs, 90) if ports else ""
                if ports and not error:
                    fill(broker.bootstrap, topic_in, records)
                # One worker process: how busy its event loop was (the supervisor of
                # --processes runs no loop of its own).
                watch = procs[0] if variant.system == "agents" and variant.processes == 1 else None
                _count, rate, collect_error, busy = (
                    (0, 0.0, "", None)
                    if error
                    else collect(broker.bootstrap, topic_out, records, procs, args.timeout, watch)
                )
                if busy is not None:
                    loop_busy[variant.name] = busy
                error = error or collect_error
            finally:
                stop(procs)
            if error:
                tail = b"".join(
                    (tmp / f"{variant.system}-{n}.log").read_bytes()[-400:]
                    for n in range(len(procs))
                )
                error += " | " + tail.decode(errors="replace").strip().replace("\n", " / ")[-300:]
            rows.append((variant.name, rate, error))
            print(f"  {variant.name}: {rate:,.0f} events/s {error}", file=sys.stderr, flush=True)
    rates = {name: rate for name, rate, _ in rows}
    raw = rates.get(VARIANTS[0].name) or 0.0
    journal = rates.get(VARIANTS[1].name) or 0.0
    journaled = {v.name for v in VARIANTS if v.journaled and v.system == "agents"}
    single = rates.get("agents_stream, sync, 1 ctx.execute") or 0.0
    out = []
    for name, rate, error in rows:
        vs_raw = rate / raw if raw else 0.0
        vs_journal = f"{rate / journal:.3f}" if journal and name in journaled else ""
        note = error[:60]
        if name.endswith("two processes") and single:
            note = f"{rate / single:.2f}x one process " + note
        if name in loop_busy:
            running, queued = loop_busy[name]
            note = f"loop runs {running:.0%} +{queued:.0%} queued " + note
        out.append((name, rate, f"{vs_raw:.3f}", vs_journal, note))
    print(f"{records:,} records, {KEYS:,} keys, {PARTITIONS} partitions; one embedded broker")
    print(table(["system", "events/s", "vs raw loop", "vs journal", "note"], out))
    return 0 if all(not e for _, _, e in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
