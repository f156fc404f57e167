"""The Spark jobs on a standalone Spark cluster, as a user runs them there.

A master and one worker started from the installed PySpark (127.0.0.1 only, the worker in
its own work directory: agents_stream.testing.spark_cluster), Apache Kafka, and an app
whose module (and the helper module it imports) exist only in a directory the driver runs
from: the executors can import them only if the job ships them. A real worker journals
20 inputs (two calls each, a memory counter) and stops; 10 more inputs wait. Then:

- audit (spark-submit), backfill to Parquet (``agents-stream spark backfill --master
  spark://``) and a dry-run reconcile give the same results as ``local[*]`` (the shared
  in-process session);
- backfill to the agent's own topic with ``--write-journal`` (spark-submit) sends the 10
  waiting inputs' outputs once, journals their calls (a later backfill replays all 20
  and executes none), and reconcile (spark-submit) settles the PENDING calls from a
  ledger;
- the one-line errors: a missing journal topic (before any JVM starts), executors whose
  Python lacks agents_stream (before the job's first task), and a corrupted journal record
  (the executor's error with the record's topic, partition and offset, and the log file
  that holds the full trace). No JVM trace and no Python traceback reach the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.spark.frames import ActionStateWriter
from agents_stream.testing.process import WorkerProcess
from agents_stream.testing.spark_cluster import SparkCluster, spark_cluster_missing
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records

# Each job is a driver JVM and an executor launch (~30 s): the main test runs eight.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.broker,
    pytest.mark.kafka_only,
    pytest.mark.timeout(900),
]

APP = '''
"""A two-call app that lives beside the driver only."""
from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from {helper} import label_for


def classify(call_id: str, n: int) -> str:
    return label_for(n)


def open_case(call_id: str, label: str) -> str:
    return f"case-{{call_id}}"


class Hist(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event: InputEvent, ctx: RunnerContext) -> None:
        n = int(event.input["n"])
        label = ctx.execute(classify, n)
        case = ctx.execute(open_case, label)
        seen = ctx.short_term_memory.get("seen", 0) + 1
        ctx.short_term_memory.set("seen", seen)
        ctx.send_event(OutputEvent(output={{"n": n, "label": label, "case": case, "seen": seen}}))


app = App({app_id!r}, prune_completed=False, partitions=2, commit_interval=0.3)
app.agent(Hist, input={input!r}, output={output!r})
'''

HELPER = "def label_for(n: int) -> str:\n    return 'high' if n % 3 == 0 else 'low'\n"

# An audit's summary, but for when and where it ran.
AUDIT_VOLATILE = ("audited_at_ms", "reports")
BACKFILL_KEYS = (
    "records", "outputs", "actions_run", "calls_executed", "calls_replayed", "errors",
    "inputs_completed",
)  # fmt: skip


@pytest.fixture(scope="module")
def cluster():
    missing = spark_cluster_missing()
    if missing:
        pytest.skip(missing)
    with SparkCluster(cores=2, memory="1g") as running:
        yield running
    running.cleanup()


class Deployment:
    """The app's directory, topics and the commands a user runs from that directory."""

    def __init__(self, broker, topic_factory, tmp_path: Path, cluster: SparkCluster) -> None:
        self.bootstrap = broker.bootstrap
        self.url = broker.url
        self.cluster = cluster
        self.dir = tmp_path / "driver"
        self.dir.mkdir()
        self.logs = tmp_path / "logs"
        token = tmp_path.name.replace("-", "_")
        self.module, helper = f"cluster_app_{token}", f"cluster_helper_{token}"
        self.app_id, self.input, self.output = (
            topic_factory("hist"), topic_factory("hist-in"), topic_factory("hist-out")
        )  # fmt: skip
        (self.dir / f"{helper}.py").write_text(HELPER)
        (self.dir / f"{self.module}.py").write_text(
            APP.format(helper=helper, app_id=self.app_id, input=self.input, output=self.output)
        )
        self.state_topic = f"{self.app_id}-action-state"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
        env.update(
            SPARK_LOCAL_IP="127.0.0.1",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            AGENTS_STREAM_BROKER=self.url,
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        )
        env.update(extra)
        return env

    def run(self, argv: list[str], *, timeout: float = 240, **env: str):
        return subprocess.run(
            argv, cwd=self.dir, env=self.env(**env), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def cli(self, job: str, *args: str, master: bool = True, **env: str):
        """``agents-stream spark JOB -A app --master spark://...``, from the app's folder."""
        argv = [sys.executable, "-m", "agents_stream", "spark", job, "-A", f"{self.module}:app"]
        if master:
            argv += ["--master", self.cluster.master_url]
        return self.run([*argv, "--log-dir", str(self.logs), *args], **env)

    def submit(self, job: str, *args: str):
        """The documented spark-submit command, from the app's folder."""
        entry = subprocess.run(
            [sys.executable, "-m", "agents_stream", "spark", "entrypoint"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        spark_submit = Path(sys.executable).parent / "spark-submit"
        return self.run(
            [str(spark_submit), "--master", self.cluster.master_url, entry, job,
             "-A", f"{self.module}:app", "--log-dir", str(self.logs), *args]
        )  # fmt: skip

    def load_app(self, monkeypatch):
        """The same App, imported in the test process (for the local[*] runs)."""
        import importlib

        monkeypatch.syspath_prepend(str(self.dir))
        return importlib.import_module(self.module).app


def summary_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, f"{done.args}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    # spark-submit runs the driver's Python with its stderr merged into stdout: the log
    # lines come first, the summary is the JSON document that ends the output.
    lines = done.stdout.splitlines()
    return json.loads("\n".join(lines[lines.index("{") :]))


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """The failure's line; asserts it is the only one and that no trace reached stderr."""
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not [line for line in done.stderr.splitlines() if line.startswith("\tat ")]
    return errors[0]


def craft_pending(dep: Deployment) -> None:
    """Two PENDING calls a crashed worker left behind (records never re-consumed)."""
    now = int(time.time() * 1000)
    refs = [
        ActionRef(key, seq, "Hist.handle#0", 0, dep.input)
        for key, seq in (("s1", 1000), ("s2", 1001))
    ]
    entries = [
        CallEntry(
            ref,
            0,
            f"{dep.module}.classify",
            "d" * 16,
            CallStatus.PENDING,
            call_id=ref.call_id(dep.app_id, 0),
            started_ms=now - 3_600_000,
            worker_id="w-gone",
        )
        for ref in refs
    ]
    with ActionStateWriter(dep.bootstrap, dep.state_topic) as writer:
        writer.write((0, e) for e in entries)


def test_jobs_on_a_standalone_cluster_match_local_mode(
    cluster, spark, broker, topic_factory, tmp_path, monkeypatch
):
    from agents_stream.spark.jobs.audit import run_audit
    from agents_stream.spark.jobs.backfill import run_backfill
    from agents_stream.spark.jobs.reconcile import Ledger, run_reconcile

    dep = Deployment(broker, topic_factory, tmp_path, cluster)
    create_topics(dep.bootstrap, [dep.input], partitions=2)
    produce(dep.bootstrap, dep.input, [(f"k{i % 5}", {"n": i}) for i in range(20)])
    worker = WorkerProcess(
        f"{dep.module}:app", broker=dep.url, data_dir=tmp_path / "data",
        log_file=tmp_path / "worker.log", cwd=dep.dir, env={"PYTHONPATH": ""},
    ).start()  # fmt: skip
    try:
        assert len(wait_for_records(dep.bootstrap, dep.output, 20, timeout=120)) == 20
    finally:
        assert worker.terminate(60) == 0, worker.log()
    assert "CRITICAL" not in worker.log()
    produce(dep.bootstrap, dep.input, [(f"k{i % 5}", {"n": i}) for i in range(20, 30)])
    craft_pending(dep)
    ledger = tmp_path / "ledger.csv"
    settled_id = ActionRef("s1", 1000, "Hist.handle#0", 0, dep.input).call_id(dep.app_id, 0)
    ledger.write_text(f'call_id,status,result\n{settled_id},SUCCEEDED,"""high"""\n')
    app = dep.load_app(monkeypatch)

    # Read-only jobs, local[2] (in process) against the cluster: the same figures.
    local_audit = run_audit(spark, app, dep.bootstrap, tmp_path / "audit-local").summary
    local_fill = run_backfill(spark, app, dep.bootstrap, output_path=tmp_path / "bf-local")
    local_rec = run_reconcile(
        spark, app, dep.bootstrap, Ledger(str(ledger), format="csv"), missing="fail",
        dry_run=True,
    ).summary  # fmt: skip
    assert (
        local_fill.summary["calls_executed"] == 20 and local_fill.summary["inputs_completed"] == 20
    )

    audit = summary_of(dep.submit("audit", "--out", str(tmp_path / "audit-cluster")))
    same = {k: v for k, v in audit.items() if k not in AUDIT_VOLATILE}
    assert same == {k: v for k, v in local_audit.items() if k not in AUDIT_VOLATILE}
    assert audit["calls_pending"] == 2

    filled = dep.cli("backfill", "--output-path", str(tmp_path / "bf-cluster"))
    fill = summary_of(filled)
    assert {k: fill[k] for k in BACKFILL_KEYS} == {k: local_fill.summary[k] for k in BACKFILL_KEYS}
    assert "Traceback" not in filled.stderr and "\tat " not in filled.stderr
    columns = ["key", "partition", "input_offset", "output_index", "value", "output_id"]

    def same_run(row) -> tuple:
        # An output's identity ends with its action run's start time and index: equal
        # outputs of two runs differ in that time only.
        identity = row["output_id"].split("/")
        return (*(row[c] for c in columns[:-1]), "/".join(identity[:-2] + identity[-1:]))

    rows = {
        name: sorted(
            same_run(r) for r in spark.read.parquet(str(tmp_path / name)).select(*columns).collect()
        )
        for name in ("bf-local", "bf-cluster")
    }
    assert len(rows["bf-cluster"]) == 10 and rows["bf-cluster"] == rows["bf-local"]

    # Jobs that write: the agent's own topic and the journal, then the ledger's results.
    sent = summary_of(dep.submit("backfill", "--output-topic", dep.output, "--write-journal"))
    assert (sent["records"], sent["calls_executed"], sent["outputs_unsent"]) == (30, 20, 10)
    outputs = [r.json() for r in read_topic(dep.bootstrap, dep.output)]
    assert sorted(o["n"] for o in outputs) == list(range(30))  # each input's output once
    again = run_backfill(spark, app, dep.bootstrap).summary
    # The journal the cluster wrote: every action of the 10 is done, nothing runs again.
    assert (again["calls_executed"], again["actions_run"], again["actions_skipped"]) == (0, 0, 10)
    assert (again["records"], again["outputs"], again["errors"]) == (30, 10, 0)

    settled = summary_of(dep.submit("reconcile", "--ledger", str(ledger), "--missing", "fail"))
    # The decisions local[*]'s dry run made, now written.
    assert {**local_rec, "written": 2, "dry_run": False} == settled
    assert (settled["pending"], settled["succeeded"], settled["failed"]) == (2, 1, 1)
    after = run_reconcile(
        spark, app, dep.bootstrap, Ledger(str(ledger), format="csv"), dry_run=True
    )
    assert after.summary["pending"] == 0

    # One line per failure.
    started = time.monotonic()
    missing = dep.cli("audit", "--broker", dep.url, "-A", "nosuch_module_x:app")
    assert (
        missing.returncode == 1 and "cannot import app module 'nosuch_module_x'" in missing.stderr
    )
    (dep.dir / "other_app.py").write_text(
        f"from agents_stream import App\nfrom {dep.module} import Hist\n"
        f"app = App('never-ran-{dep.app_id}')\napp.agent(Hist, input={dep.input!r})\n"
    )
    no_journal = dep.run(
        [sys.executable, "-m", "agents_stream", "spark", "audit", "-A", "other_app:app",
         "--master", cluster.master_url]
    )  # fmt: skip
    line = one_error_line(no_journal)
    assert f"topic 'never-ran-{dep.app_id}-action-state' does not exist" in line
    assert time.monotonic() - started < 30  # before any JVM starts

    bare = tmp_path / "bare-python"
    venv.create(bare, with_pip=False)  # the same Python, without agents_stream
    wrong = dep.cli(
        "backfill",
        "--output-path",
        str(tmp_path / "never"),
        PYSPARK_PYTHON=str(bare / "bin" / "python"),
    )
    line = one_error_line(wrong)
    assert "the executors cannot run the job's Python" in line
    assert "No module named 'agents_stream'" in line and "--archives" in line
    assert not (tmp_path / "never").exists()

    slot = CallEntry(ActionRef("k1", 99, "Hist.handle#0", 1, dep.input), 0, "f", "d" * 16,
                     CallStatus.PENDING)  # fmt: skip
    with ActionStateWriter(dep.bootstrap, dep.state_topic) as writer:
        writer.write_raw([(1, entry_key_bytes(slot), b"garbage")])
    corrupt = dep.cli("backfill", "--output-path", str(tmp_path / "never"))
    line = one_error_line(corrupt)
    assert (
        "JournalDecodeError" in line and f"(topic {dep.state_topic}, partition 1, offset " in line
    )
    assert "executor" in line
    log_file = Path(line.rsplit("full trace in ", 1)[1])
    trace = log_file.read_text()
    assert "Traceback (most recent call last)" in trace and "JournalDecodeError" in trace


def test_a_packed_environment_serves_executors_without_agents_stream(
    cluster, broker, topic_factory, tmp_path
):
    """docs/reference.md's recipe, as written: a venv with agents_stream installed from its
    wheel, packed with venv-pack, given as ``--archives env.tar.gz#env`` with
    ``PYSPARK_PYTHON=./env/bin/python``; the executors run that interpreter (the cluster
    has none with agents_stream), the driver plans the reads with the same path."""
    dep = Deployment(broker, topic_factory, tmp_path, cluster)
    create_topics(dep.bootstrap, [dep.input], partitions=2)
    produce(dep.bootstrap, dep.input, [(f"k{i % 3}", {"n": i}) for i in range(10)])
    wheels = tmp_path / "wheels"
    root = Path(__file__).resolve().parents[2]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), str(root)], check=True)
    env_dir = dep.dir / "env"
    venv.create(env_dir, with_pip=True)
    subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", *map(str, wheels.glob("*.whl")),
         "pandas<3", "pyarrow>=15", "venv-pack"],
        check=True, timeout=600,
    )  # fmt: skip
    subprocess.run(
        [str(env_dir / "bin" / "venv-pack"), "-q", "-p", str(env_dir), "-o",
         str(dep.dir / "env.tar.gz")],
        check=True, timeout=300,
    )  # fmt: skip

    packed = ("--archives", "env.tar.gz#env", "--output-path", str(tmp_path / "out"))
    done = dep.cli("backfill", *packed, "--no-journal", PYSPARK_PYTHON="./env/bin/python")
    summary = summary_of(done)
    assert (summary["records"], summary["calls_executed"], summary["errors"]) == (10, 20, 0)
    unpacked = [
        log
        for log in cluster.executor_logs()
        if "env.tar.gz#env" in log.read_text(errors="replace")
    ]
    assert unpacked, "no executor unpacked the environment"

    # From a folder without ./env the driver could not plan the reads: one line, at once.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"{dep.module}.py").write_text((dep.dir / f"{dep.module}.py").read_text())
    for helper in dep.dir.glob("cluster_helper_*.py"):
        (elsewhere / helper.name).write_text(helper.read_text())
    wrong = subprocess.run(
        [sys.executable, "-m", "agents_stream", "spark", "backfill", "-A", f"{dep.module}:app",
         "--master", cluster.master_url, "--archives", str(dep.dir / "env.tar.gz") + "#env",
         "--output-path", str(tmp_path / "never"), "--no-journal"],
        cwd=elsewhere, env=dep.env(PYSPARK_PYTHON="./env/bin/python"), capture_output=True,
        text=True, timeout=240, check=False,
    )  # fmt: skip
    line = one_error_line(wrong)
    assert "PYSPARK_PYTHON=./env/bin/python does not exist" in line and "./env/" in line
