"""A backfill's records/s on ``local[2]`` and on a standalone Spark cluster, side by side.

One input topic of ``--records`` JSON records (default 40k; ``--quick`` 10k) over 4
partitions and 1,000 keys on a fresh embedded broker; an app with one journaled call per
record, in a folder only the driver runs from (the cluster's executors get it shipped);
no journal yet, so every call executes. Each master runs the same command a user runs::

    agents-stream spark backfill -A bench_cluster_app:app --master M --output-path DIR \\
        --no-journal

and the rate is the records over the wall time of the job's run step (its log line "run
... done in"), so the JVM's start-up and the executors' launch are not in it; the whole
command's wall time is printed beside. The cluster is a master and one worker of
``--cores`` cores (default 2) from the installed PySpark on 127.0.0.1
(:mod:`agents_stream.testing.spark_cluster`): on one machine it shows what the cluster
path costs (the shipping, the probe task, a remote executor's Python workers), not how it
scales. Both runs must report the same summary; the script fails if they do not.

Run: ``.venv/bin/python bench/bench_spark_cluster.py [--quick] [--records N] [--cores N]``
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import create_topic, produce_all
from common import parser as bench_parser

from agents_stream.testing import EmbeddedBroker
from agents_stream.testing.spark_cluster import SparkCluster

APP = """
from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action


def score(call_id: str, n: int) -> int:
    return n * 7 % 100


class Scorer(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event: InputEvent, ctx: RunnerContext) -> None:
        s = ctx.execute(score, int(event.input["n"]))
        ctx.send_event(OutputEvent(output={"n": event.input["n"], "score": s}))


app = App("bench-cluster", prune_completed=False, partitions=4)
app.agent(Scorer, input="bench-cluster-in", output="bench-cluster-out")
"""

PARTITIONS = 4
STEP = re.compile(r"backfill: run Scorer over \S+ done in ([\d.]+)s")
SAME = ("records", "outputs", "actions_run", "calls_executed", "calls_replayed", "errors")


def run(folder: Path, broker: str, master: str, out: Path) -> tuple[dict, float, float]:
    """(summary, run step seconds, whole command seconds) of one backfill."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "agents_stream", "spark", "backfill", "-A",
         "bench_cluster_app:app", "--broker", broker, "--master", master,
         "--output-path", str(out), "--no-journal", "--log-dir", str(folder / "logs")],
        cwd=folder, env=env, capture_output=True, text=True, check=False, timeout=1800,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"backfill on {master} failed: {done.stderr.strip().splitlines()[-1:]}")
    step = STEP.search(done.stderr)
    assert step, done.stderr
    lines = done.stdout.splitlines()
    return json.loads("\n".join(lines[lines.index("{") :])), float(step.group(1)), wall


def main() -> int:
    p = bench_parser(__doc__)
    p.add_argument("--records", type=int, default=None, help="input records (default 40k)")
    p.add_argument("--cores", type=int, default=2, help="the cluster worker's cores")
    args = p.parse_args()
    records = args.records or (10_000 if args.quick else 40_000)
    folder = Path(tempfile.mkdtemp(prefix="bench-spark-cluster-"))
    (folder / "bench_cluster_app.py").write_text(APP)
    with EmbeddedBroker() as broker:
        create_topic(broker.bootstrap, "bench-cluster-in", PARTITIONS)
        produce_all(
            broker.bootstrap,
            "bench-cluster-in",
            (
                (i % PARTITIONS, f"k{i % 1000}".encode(), json.dumps({"n": i}).encode())
                for i in range(records)
            ),
        )
        print(f"# spark backfill, {records} records, {PARTITIONS} partitions, one call each")
        rows = []
        local = run(folder, broker.url, "local[2]", folder / "out-local")
        rows.append(("local[2]", *local))
        with SparkCluster(cores=args.cores) as cluster:
            remote = run(folder, broker.url, cluster.master_url, folder / "out-cluster")
            rows.append((f"standalone, 1 worker x {args.cores} cores", *remote))
        for key in SAME:
            assert local[0][key] == remote[0][key], (key, local[0], remote[0])
    base = records / rows[0][2]
    print(f"{'master':<32} {'records/s':>10} {'vs local[2]':>12} {'run step':>9} {'command':>9}")
    for name, _summary, step, wall in rows:
        rate = records / step
        print(f"{name:<32} {rate:>10,.0f} {rate / base:>11.2f}x {step:>8.1f}s {wall:>8.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
