"""End to end: events/s of agents_stream workers vs raw loops, Quix Streams, Bytewax, Faust.

Every system drains the same backlog (``--records`` JSON records, 1,000 keys, 4
partitions, produced before it starts) from its own copy of the input topic into its own
output topic, on one broker (``--broker embedded``, the default, or ``kafka``: Apache
Kafka from ``make kafka``), in one run. The rate is outputs per second of the reader's
arrival times from 10 % of the outputs to 90 % (``10-90 %``), and from the first output to
the last (``first-last``: a loop that serves its delivery reports late releases outputs
in bursts, which the 10-90 % window can flatter). A drain shorter than 2 s is flagged
(it measures start-up). Not output timestamps: Quix Streams copies
input timestamps to outputs, and exactly-once outputs arrive when their transaction
commits, not when produced), so group joins, start-up and the tail do not count; ``ratio`` is
against the raw confluent-kafka consume->produce loop of the same run, and for journaled
agents_stream rows also against the raw journal-before-output loop (``vs journal``).
For a single worker process the note says, from 10 % of the outputs to 90 %, the share its
event-loop thread ran on a CPU and the share it was runnable but queued for one (Linux
``schedstat``): together near 100 % the worker is CPU-bound on that thread (on this
2-core machine the broker and the other threads take a core from it now and then); well
below, it waits (for acks, the broker, other threads).

Over the same steady state, ``us/rec + broker  cores`` gives the CPU time per output of
the system's own processes (every thread; a supervisor's workers included) and of the
broker, and how many CPUs the system, the broker and this reader kept busy together: a
row near the machine's core count cannot go faster by running more processes, only by
spending less per record. After the table, each throughput goal (issue 13's against the
raw loops, issue 51's against Quix Streams with state) is restated as a CPU budget: what the worker's loop thread spends per record now (steady state), and
what it may spend for the row to reach the goal's rate (the same, divided by goal rate /
rate: the loop stays the bottleneck).

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
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import create_topic, parser, table
from confluent_kafka import Consumer, Producer, TopicPartition

from agents_stream.kafka.admin import TopicAdmin, TopicSpec
from agents_stream.testing import EmbeddedBroker, free_port

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ROOT / "bench" / "e2e" / "systems.py"
PARTITIONS = 4
KEYS = 1000
MIN_CPU_WINDOW_S = 0.5  # shorter steady states get no CPU figures (10 ms ticks)
# A drain (first to last output) shorter than this measures start-up and the first
# fetches more than throughput: its row is flagged, and the run says to use more records.
MIN_DRAIN_S = 2.0
QUIX_STATE = "Quix Streams, one RocksDB state write per record"


@dataclass
class Variant:
    name: str
    system: str  # a systems.py name, or "agents"
    env: dict[str, str] = field(default_factory=dict)
    processes: int = 1
    journaled: bool = False
    args: list[str] = field(default_factory=list)  # extra worker CLI arguments
    kafka_only: bool = False  # needs isolating transactions (Apache Kafka)


EXACTLY_ONCE = ["--processing-guarantee", "exactly-once"]


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
        "agents_stream, sync, 0 calls, exactly-once",
        "agents",
        {"AS_BENCH_CALLS": "0"},
        args=EXACTLY_ONCE,
        kafka_only=True,
    ),
    Variant(
        "agents_stream, sync, 1 ctx.execute, exactly-once",
        "agents",
        {"AS_BENCH_CALLS": "1"},
        journaled=True,
        args=EXACTLY_ONCE,
        kafka_only=True,
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


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children(pids: list[int]) -> list[int]:
    """The child processes of ``pids`` (a ``--processes`` supervisor's workers)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid in pids:
            out.append(int(stat.parent.name))
    return out


def process_cpu(pids: list[int]) -> float:
    """CPU seconds so far of processes ``pids``, every thread (Linux ``/proc``; 0 else)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


@dataclass
class Sample:
    """What one moment of a drain had used: outputs read, the worker's loop thread
    (running, queued; a single worker only), CPU of the system's processes, of the
    broker, of this reader."""

    at: float
    outputs: int
    loop: tuple[float, float] | None  # summed over the worker processes
    system: float
    broker: float
    reader: float


@dataclass
class Window:
    """The steady state of a drain (10 % to 90 % of the outputs) between two samples."""

    first: Sample
    last: Sample

    @property
    def wall(self) -> float:
        return self.last.at - self.first.at

    def per_record_us(self, what: str) -> float:
        done = self.last.outputs - self.first.outputs
        used = getattr(self.last, what) - getattr(self.first, what)
        return used / max(done, 1) * 1e6

    workers: int = 1

    @property
    def loop_busy(self) -> tuple[float, float] | None:
        """Shares of the wall time a worker's loop thread ran and was queued (mean)."""
        if self.first.loop is None or self.last.loop is None:
            return None
        wall = self.wall * self.workers
        return (
            (self.last.loop[0] - self.first.loop[0]) / wall,
            (self.last.loop[1] - self.first.loop[1]) / wall,
        )

    @property
    def loop_us(self) -> float | None:
        if self.first.loop is None or self.last.loop is None:
            return None
        done = max(self.last.outputs - self.first.outputs, 1)
        return (self.last.loop[0] - self.first.loop[0]) / done * 1e6

    @property
    def cores(self) -> float:
        """CPUs kept busy by the system, the broker and the reader together."""
        used = sum(
            getattr(self.last, w) - getattr(self.first, w) for w in ("system", "broker", "reader")
        )
        return used / self.wall


def loop_cpu(pids: list[int]) -> tuple[float, float] | None:
    """Seconds so far that the main threads of ``pids``, where workers run their event
    loop, spent on a CPU and runnable waiting for one, summed (Linux schedstat); None
    without it."""
    running = queued = 0
    try:
        for pid in pids:
            ran, waited, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
            running, queued = running + int(ran), queued + int(waited)
    except (OSError, ValueError):
        return None
    return running / 1e9, queued / 1e9


def collect(
    bootstrap: str,
    topic: str,
    expected: int,
    procs: list[subprocess.Popen[bytes]],
    timeout: float,
    workers: bool = False,
    broker_pid: int | None = None,
) -> tuple[int, tuple[float, float, float], str, Window | None]:
    """Count outputs until ``expected`` arrived (or no progress / a process died), and
    sample from 10 % of the outputs to 90 % the CPU the system's processes, the broker
    and this reader used; with ``workers`` (agents_stream: ``procs`` are workers or a
    supervisor of workers) also the time their event-loop threads ran, and waited for a
    CPU (runnable)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    stamps: list[int] = []
    arrivals: list[tuple[float, int]] = []  # (arrival time, outputs so far) per batch
    deadline = time.monotonic() + timeout
    last_progress = time.monotonic()
    assigned = False
    error = ""
    first: Sample | None = None
    last: Sample | None = None
    pids: list[int] = []
    loops: list[int] = []
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
                arrivals.append((last_progress, len(stamps)))
                # From 10 % of the outputs to 90 %: the drain's steady state, without
                # the start (fetching, first batches) and the tail (the last acks).
                if len(stamps) >= expected // 10 and (
                    last is None or len(stamps) - len(got) < expected * 9 // 10
                ):
                    if not pids:  # the workers of a supervisor exist by now
                        pids = [p.pid for p in procs]
                        kids = children(pids)
                        pids += kids
                        loops = (kids or pids) if workers else []
                    last = Sample(
                        last_progress,
                        len(stamps),
                        loop_cpu(loops) if loops else None,
                        process_cpu(pids),
                        process_cpu([broker_pid]) if broker_pid else 0.0,
                        time.process_time(),
                    )
                    first = first or last
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
    window = Window(first, last, len(loops)) if first and last and last.at > first.at else None
    if len(stamps) < 2:
        return len(stamps), (0.0, 0.0, 0.0), error or "no output", window
    return len(stamps), arrival_rates(arrivals, len(stamps)), error, window


def arrival_rates(arrivals: list[tuple[float, int]], total: int) -> tuple[float, float, float]:
    """(10-90 % rate, first-to-last rate, drain seconds from the first batch of outputs to
    the last). First to last counts the outputs after the first batch over the time
    since it arrived."""
    (t0, n0), (t1, n1) = arrivals[0], arrivals[-1]
    drain = t1 - t0
    whole = (n1 - n0) / drain if drain > 0 else 0.0
    return arrival_rate(arrivals, total), whole, drain


def arrival_rate(arrivals: list[tuple[float, int]], total: int) -> float:
    """Outputs per second as the reader received them, from the batch that took the count
    past 10 % of ``total`` to the one that took it past 90 %; over every batch when the
    drain came in too few of them to tell."""
    lo = next((i for i, (_, n) in enumerate(arrivals) if n >= total // 10), 0)
    hi = next((i for i, (_, n) in enumerate(arrivals) if n >= total * 9 // 10), len(arrivals) - 1)
    if hi <= lo:
        lo, hi = 0, len(arrivals) - 1
    (t0, n0), (t1, n1) = arrivals[lo], arrivals[hi]
    if hi == lo or t1 <= t0:
        return 0.0
    return (n1 - n0) / (t1 - t0)


def sampled(
    directory: str, variant: Variant, procs: list[subprocess.Popen[bytes]]
) -> list[subprocess.Popen[bytes]]:
    """py-spy attached to an agents_stream worker (``--py-spy``): every thread, collapsed
    stacks, idle samples left out."""
    if variant.system != "agents" or variant.processes > 1:
        return []
    Path(directory).mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", variant.name.lower()).strip("-")
    spy = Path(sys.executable).with_name("py-spy")
    cmd = [str(spy), "record", "--pid", str(procs[0].pid), "--rate", "200", "--nonblocking",
           "--format", "raw", "--output", str(Path(directory) / f"{slug}.txt")]  # fmt: skip
    return [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]


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
    p.add_argument(
        "--broker",
        choices=["embedded", "kafka"],
        default=os.environ.get("AGENTS_STREAM_BENCH_BROKER", "embedded"),
        help="embedded (Tansu, default) or kafka (Apache Kafka 4, from `make kafka`'s jars); "
        "exactly-once rows run on kafka only ($AGENTS_STREAM_BENCH_BROKER)",
    )
    p.add_argument(
        "--py-spy",
        metavar="DIR",
        default="",
        help="sample each agents_stream worker with py-spy (200 Hz, not blocking it) into "
        "DIR/<variant>.txt, collapsed stacks; a diagnosis, not a figure: sampling takes CPU",
    )
    args = p.parse_args()
    records = args.records or (20_000 if args.quick else 50_000)
    wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    variants = [
        v
        for v in VARIANTS
        if (not wanted or any(w in f"{v.name} {v.system}".lower() for w in wanted))
        and (args.broker == "kafka" or not v.kafka_only)
    ]
    rows: list[tuple[str, float, str]] = []
    whole: dict[str, tuple[float, float]] = {}  # name -> (first-to-last rate, drain s)
    windows: dict[str, Window] = {}
    if args.broker == "kafka":
        from agents_stream.testing.kafka import KafkaBroker

        brokers: Any = KafkaBroker()
    else:
        brokers = EmbeddedBroker()
    with brokers as broker, tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp_dir:
        tmp = Path(tmp_dir)
        for i, variant in enumerate(variants):
            topic_in, topic_out = f"e2e-{i}-in", f"e2e-{i}-out"
            settle_first = variant.system == "agents" and variant.processes > 1
            fill(broker.bootstrap, topic_in, 0 if settle_first else records)
            create_topic(broker.bootstrap, topic_out, PARTITIONS)
            ports = free_ports(variant.processes) if settle_first else None
            procs = start(variant, broker.bootstrap, topic_in, topic_out, tmp, ports)
            spies = sampled(args.py_spy, variant, procs) if args.py_spy else []
            try:
                error = wait_assigned(ports, procs, 90) if ports else ""
                if ports and not error:
                    fill(broker.bootstrap, topic_in, records)
                _count, (rate, first_last, drain), collect_error, window = (
                    (0, (0.0, 0.0, 0.0), "", None)
                    if error
                    else collect(
                        broker.bootstrap,
                        topic_out,
                        records,
                        procs,
                        args.timeout,
                        variant.system == "agents",
                        broker.pid,
                    )
                )
                if window is not None:
                    windows[variant.name] = window
                whole[variant.name] = (first_last, drain)
                error = error or collect_error
            finally:
                for spy in spies:  # SIGINT: py-spy writes what it sampled, then exits
                    spy.send_signal(signal.SIGINT)
                stop(procs)
                for spy in spies:
                    spy.wait(30)
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
    quix = rates.get(QUIX_STATE) or 0.0
    out = []
    short = []
    for name, rate, error in rows:
        vs_raw = rate / raw if raw else 0.0
        vs_journal = f"{rate / journal:.3f}" if journal and name in journaled else ""
        vs_quix = f"{rate / quix:.3f}" if quix else ""
        first_last, drain = whole.get(name, (0.0, 0.0))
        note = error[:60]
        if rate and drain < MIN_DRAIN_S:
            short.append(name)
            note = f"DRAIN {drain:.2f}s < {MIN_DRAIN_S:.0f}s: start-up, not throughput " + note
        if name.endswith("two processes") and single:
            note = f"{rate / single:.2f}x one process " + note
        window = windows.get(name)
        cpu = ""
        if window is not None:
            busy = window.loop_busy
            if busy is not None:
                loops = "loop runs" if window.workers == 1 else "loops run (mean)"
                note = f"{loops} {busy[0]:.0%} +{busy[1]:.0%} queued " + note
            # /proc counts CPU time in 10 ms ticks: a drain of a fraction of a second
            # (the raw loops, Quix) has too few of them to divide by its records.
            if window.wall >= MIN_CPU_WINDOW_S:
                cpu = (
                    f"{window.per_record_us('system'):.0f} + {window.per_record_us('broker'):.0f}"
                    f"   {window.cores:.2f}"
                )
        out.append(
            (name, rate, f"{first_last:,.0f}", f"{drain:.1f}", f"{vs_raw:.3f}", vs_journal,
             vs_quix, cpu, note)
        )  # fmt: skip
    kind = "Apache Kafka" if args.broker == "kafka" else "embedded"
    print(
        f"{records:,} records, {KEYS:,} keys, {PARTITIONS} partitions; one {kind} broker; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, commit {_commit()}; "
        f"bench/bench_e2e.py --broker {args.broker} --records {records}"
    )
    eos = [
        (name, rates.get(name) or 0.0, rates.get(name.removesuffix(", exactly-once")) or 0.0)
        for name in rates
        if name.endswith(", exactly-once")
    ]
    print(
        table(
            [
                "system",
                "events/s 10-90 %",
                "first-last",
                "drain s",
                "vs raw loop",
                "vs journal",
                "vs Quix state",
                "us/rec + broker  cores",
                "note",
            ],
            out,
        )
    )
    if short:
        print(
            f"{len(short)} drains were shorter than {MIN_DRAIN_S:.0f} s: their rates measure "
            "start-up and the first fetches; run with more --records (60,000+ on Apache Kafka)"
        )
    for name, rate, base in eos:
        if base:
            print(f"{name}: {rate / base:.2f}x at-least-once in this run")
    budgets = budget_rows(rates, windows, {"raw": raw, "journal": journal, "Quix state": quix})
    if budgets:
        print()
        print(
            "CPU per record on the worker's event-loop thread (steady state), now and at the\n"
            "goal's rate if that thread stays the bottleneck:"
        )
        print(table(["row", "goal", "loop us/rec now", "at the goal", "x less needed"], budgets))
    return 0 if all(not e for _, _, e in rows) else 1


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


# The throughput goals: (row, baseline, ratio). Issue 13's against the raw loops, issue
# 51's against Quix Streams with a state write per record.
GOALS = [
    ("agents_stream, sync, 0 calls", "raw", 0.3),
    ("agents_stream, sync, 1 ctx.execute", "journal", 0.5),
    ("agents_stream, async, 1 ctx.execute_async", "journal", 0.5),
    ("agents_stream, sync, 3 ctx.execute", "journal", 0.25),
    ("agents_stream, async, 3 ctx.execute_async", "journal", 0.25),
    ("agents_stream, sync, 0 calls", "Quix state", 1.0),
    ("agents_stream, sync, 1 ctx.execute", "Quix state", 0.5),
]


def budget_rows(
    rates: dict[str, float], windows: dict[str, Window], baselines: dict[str, float]
) -> list[tuple[str, str, str, str, str]]:
    """Each goal as a CPU budget: what the loop thread spends per record in the drain's
    steady state now, and what it could spend for the row to reach the goal's rate (the
    same time per record, scaled by rate / goal rate: the loop stays the bottleneck and
    the start and the tail of a drain cost what they cost now)."""
    out = []
    for name, base, ratio in GOALS:
        window, baseline = windows.get(name), baselines.get(base, 0.0)
        now = window.loop_us if window is not None else None
        rate = rates.get(name) or 0.0
        if now is None or not baseline or not rate:
            continue
        factor = ratio * baseline / rate
        out.append(
            (
                name.removeprefix("agents_stream, "),
                f">= {ratio} x {base}",
                f"{now:.1f}",
                f"{now / factor:.1f}",
                f"{factor:.2f}",
            )
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
