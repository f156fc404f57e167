"""Python calls per record: the figure that does not move with the machine's noise.

Each system drains N and then 2N records (JSON, 1,000 keys, 4 partitions, the e2e
bench's backlog) on its own embedded broker, in a subprocess, with cProfile on the
threads that do its per-record work; calls per record = (calls(2N) - calls(N)) / N, so
start-up, group joins and shutdown cancel out. Every call cProfile sees counts, builtins
included.

Counted threads: agents_stream's event loop (actions, group commits, delivery reports
served between the loop's callbacks), its Kafka thread (consume, rebalance callbacks) and
its code-block threads (the user's functions, and the journaling of their outcomes that
runs there); not librdkafka's own. Quix Streams runs everything on its main thread, all
of it counted.

Beside it, the own functions a record crosses: functions of the system's own package
called at least 0.9 times per record on its loop thread (Quix: its main thread), and the
files they are in; the shape of the record path, also independent of the machine.

Budgets of issue 41: no journaled call <= 120 calls per record (Quix with state: ~138),
each journaled call <= 100 more. ``--breakdown K`` prints, per system, the K functions
with the most calls per record (differenced the same way), then the K functions whose own
lines make the most calls (a caller's count is every call cProfile saw it make): where the
calls go, and from where.
"""

from __future__ import annotations

import cProfile
import json
import logging
import multiprocessing
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from common import parser, table  # noqa: E402

SYSTEMS = {
    "agents_stream, sync, 0 calls": ("as", "0", "sync"),
    "agents_stream, sync, 1 ctx.execute": ("as", "1", "sync"),
    "agents_stream, sync, 3 ctx.execute": ("as", "3", "sync"),
    "agents_stream, async, 1 ctx.execute_async": ("as", "1", "async"),
    "Quix Streams, stateless": ("quix", "0", ""),
    "Quix Streams, one RocksDB state write per record": ("quix", "1", ""),
}


def read_outputs(bootstrap: str, topic: str, records: int, done: Any) -> None:
    """Separate process: tells ``done`` once ``records`` outputs are in ``topic``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "log_level": 3})
    while True:
        meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.partitions:
            break
        time.sleep(0.2)
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    seen = 0
    while seen < records:
        seen += sum(1 for m in consumer.consume(5000, 0.5) if m.error() is None)
    done.put(seen)


def _stop_when_read(bootstrap: str, topic: str, records: int, stop: Any) -> None:
    done = multiprocessing.get_context("spawn").Queue()
    reader = multiprocessing.get_context("spawn").Process(
        target=read_outputs, args=(bootstrap, topic, records, done)
    )
    reader.start()

    def wait() -> None:
        done.get()
        stop()
        reader.join()

    threading.Thread(target=wait, daemon=True).start()


def drain_agents_stream(
    bootstrap: str, records: int, calls: str, kind: str
) -> list[cProfile.Profile]:
    tag = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"calls-in-{tag}", f"calls-out-{tag}"
    os.environ.update(AS_BENCH_CALLS=calls, AS_BENCH_KIND=kind, AS_BENCH_INPUT=topic_in,
                      AS_BENCH_OUTPUT=topic_out, AS_BENCH_APP=f"calls-{tag}")  # fmt: skip
    import bench_e2e

    from agents_stream.durable.pool import CodeBlockPool
    from agents_stream.runtime.worker import Worker
    from bench.e2e.as_app import app

    pool_profiles: list[cProfile.Profile] = []
    work = CodeBlockPool._work

    def profiled_work(pool: CodeBlockPool) -> None:  # each code-block thread, whole life
        profile = cProfile.Profile()
        pool_profiles.append(profile)
        profile.enable()
        try:
            work(pool)
        finally:
            profile.disable()

    CodeBlockPool._work = profiled_work  # type: ignore[method-assign, assignment]

    bench_e2e.fill(bootstrap, topic_in, records)
    with tempfile.TemporaryDirectory() as data:
        worker = Worker(app, broker=bootstrap, data_dir=data)
        loop_profile, kafka_profile = cProfile.Profile(), cProfile.Profile()
        worker._kafka.submit(kafka_profile.enable).result()  # its one thread, from now on
        _stop_when_read(bootstrap, topic_out, records, worker.stop)
        loop_profile.enable()
        worker.run()
        loop_profile.disable()
    # The executors are shut down by then: the Kafka and pool threads' profiles stopped.
    return [loop_profile, kafka_profile, *pool_profiles]


def drain_quix(bootstrap: str, records: int, stateful: bool) -> list[cProfile.Profile]:
    import bench_e2e
    from quixstreams import Application
    from quixstreams.models import TopicConfig

    from bench.e2e.systems import enrich

    tag = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"calls-in-{tag}", f"calls-out-{tag}"
    bench_e2e.fill(bootstrap, topic_in, records)
    with tempfile.TemporaryDirectory() as state_dir:
        app = Application(
            broker_address=bootstrap,
            consumer_group=f"quix-{tag}",
            auto_offset_reset="earliest",
            state_dir=state_dir,
            consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1500},
            loglevel="WARNING",
        )
        config = TopicConfig(num_partitions=4, replication_factor=1,
                             extra_config={"retention.ms": "86400000"})  # fmt: skip
        sdf = app.dataframe(app.topic(topic_in, value_deserializer="json", config=config))
        if stateful:

            def count(value: dict[str, Any], state: Any) -> dict[str, Any]:
                seen = state.get("seen", 0) + 1
                state.set("seen", seen)
                return {**enrich(value), "n": seen}

            sdf = sdf.apply(count, stateful=True)
        else:
            sdf = sdf.apply(enrich)
        sdf.to_topic(app.topic(topic_out, value_serializer="json", config=config))
        _stop_when_read(bootstrap, topic_out, records, app.stop)
        profile = cProfile.Profile()
        profile.enable()
        app.run()
        profile.disable()
    return [profile]


def child(system: str, records: int) -> None:
    """One drain in this process: prints the calls counted."""
    logging.basicConfig(level=logging.WARNING)
    from agents_stream.testing import EmbeddedBroker

    kind, calls, mode = SYSTEMS[system]
    with EmbeddedBroker() as broker:
        if kind == "as":
            profiles = drain_agents_stream(broker.bootstrap, records, calls, mode)
        else:
            profiles = drain_quix(broker.bootstrap, records, stateful=calls == "1")
    functions: dict[str, int] = {}  # calls of each function
    callers: dict[str, int] = {}  # calls made from each function's own body
    # The loop thread's (Quix: the main thread's) calls of each function of the system's
    # own package: the own-functions figure.
    own = "agents_stream/" if kind == "as" else "quixstreams/"
    loop_own = {
        _named(where): ncalls
        for where, (_, ncalls, *_rest) in pstats.Stats(profiles[0]).stats.items()  # type: ignore[attr-defined]
        if own in where[0]
    }
    for profile in profiles:
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        for where, (_, ncalls, _tt, _ct, called_from) in stats.items():
            name = _named(where)
            functions[name] = functions.get(name, 0) + ncalls
            for caller, (_, made, *_rest) in called_from.items():
                caller_name = _named(caller)
                callers[caller_name] = callers.get(caller_name, 0) + made
    print(json.dumps({"calls": sum(functions.values()), "functions": functions,
                      "callers": callers, "own": loop_own}), flush=True)  # fmt: skip


def _named(where: tuple[str, int, str]) -> str:
    path, line, name = where
    return f"{os.path.relpath(path, ROOT) if path.startswith(ROOT) else path}:{line}({name})"


def count(system: str, records: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", system, "--records", str(records)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{system}: drain failed: {out.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=None, help="N (default 10000, quick 4000)")
    p.add_argument("--only", default="", help="systems whose name contains this text")
    p.add_argument("--child", default=None, help=argparse_hidden())
    p.add_argument(
        "--breakdown", type=int, default=0, metavar="K",
        help="also print each system's K functions with the most calls per record",
    )  # fmt: skip
    p.add_argument(
        "--own", action="store_true",
        help="also print each system's own functions a record crosses, by file",
    )  # fmt: skip
    args = p.parse_args()
    records = args.records or (4000 if args.quick else 10000)
    if args.child:
        child(args.child, records)
        return 0
    rows: list[list[object]] = []
    per: dict[str, float] = {}
    breakdowns: list[tuple[str, list[list[object]]]] = []
    crossings: list[tuple[str, list[str]]] = []
    for system in SYSTEMS:
        if args.only and args.only not in system:
            continue
        try:
            small_run, large_run = count(system, records), count(system, 2 * records)
        except RuntimeError as exc:
            rows.append([system, "-", "-", "-", "-", str(exc).splitlines()[0][:60]])
            continue
        small, large = small_run["calls"], large_run["calls"]
        per[system] = (large - small) / records
        functions, files = own_functions(small_run["own"], large_run["own"], records)
        if args.own:
            crossings.append((system, crossed(small_run["own"], large_run["own"], records)))
        rows.append([system, small, large, f"{per[system]:.0f}", f"{functions} in {files}", ""])
        if args.breakdown:
            rows_of: list[list[object]] = []
            for part in ("functions", "callers"):
                before, after = small_run[part], large_run[part]
                diff = {f: (n - before.get(f, 0)) / records for f, n in after.items()}
                most = sorted(diff.items(), key=lambda item: -item[1])[: args.breakdown]
                rows_of += [[f"{n:.2f}", part[:-1], f] for f, n in most]
            breakdowns.append((system, rows_of))
    print(f"Python calls per record: (calls over {2 * records:,} - calls over {records:,}) / "
          f"{records:,}; loop, Kafka and code-block threads for agents_stream, the main thread for Quix")  # fmt: skip
    print(table(["system", f"calls, {records:,}", f"calls, {2 * records:,}", "per record",
                 "own functions in files", "note"], rows))  # fmt: skip
    print(f"own functions: of the system's package, called >= {OWN_PER_RECORD} times per record "
          "on the loop thread (Quix: its main thread), differenced the same way; and the files "
          "they are in")  # fmt: skip
    base = per.get("agents_stream, sync, 0 calls")
    one = per.get("agents_stream, sync, 1 ctx.execute")
    quix = per.get("Quix Streams, one RocksDB state write per record")
    if base is not None:
        print(f"\nbudget, no journaled call <= 120: {base:.0f}"
              + (f" (Quix with state: {quix:.0f})" if quix is not None else ""))  # fmt: skip
    if base is not None and one is not None:
        print(f"budget, each journaled call <= 100 more: {one - base:.0f}")
    for system, top in breakdowns:
        print(f"\n{system}: calls per record: the functions called most, then the functions"
              " whose own lines make the most calls")  # fmt: skip
        print(table(["per record", "as", "function"], top))
    for system, names in crossings:
        by_file: dict[str, list[str]] = {}
        for name in names:
            path, _, function = name.partition(":")
            by_file.setdefault(path, []).append(function)
        print(f"\n{system}: own functions a record crosses ({len(names)} in {len(by_file)} files)")
        for path, listed in sorted(by_file.items(), key=lambda item: -len(item[1])):
            print(f"{len(listed):3d}  {path}: {', '.join(sorted(listed))}")
    return 0


OWN_PER_RECORD = 0.9


def own_functions(small: dict[str, int], large: dict[str, int], records: int) -> tuple[int, int]:
    """How many of the system's own functions a record crosses (called at least
    ``OWN_PER_RECORD`` times per record, N vs 2N), and in how many files."""
    names = crossed(small, large, records)
    return len(names), len({f.rsplit(":", 1)[0] for f in names})


def crossed(small: dict[str, int], large: dict[str, int], records: int) -> list[str]:
    return [f for f, n in large.items() if (n - small.get(f, 0)) / records >= OWN_PER_RECORD]


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
