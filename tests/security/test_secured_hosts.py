"""The other hosts on the secured cluster (SASL_SSL, SCRAM-SHA-512, ACLs) as a principal
granted exactly what ``agents-stream acls`` prints: a Faust app with a durable agent, and
the Spark audit and backfill jobs; the password in none of their output."""

from __future__ import annotations

import json
import sys
import time

import pytest

from agents_stream.testing.process import WorkerProcess
from agents_stream.testing.topics import create_topics, produce, wait_for_records
from tests.apps.effects import connect
from tests.security.conftest import ROOT, grant, printed_acls
from tests.security.test_secured_worker import APP, assert_no_password, cli, secured_setup

pytestmark = [pytest.mark.kafka_only, pytest.mark.timeout(300)]


def test_faust_host(secured, names, tmp_path):
    pytest.importorskip("faust")
    env = {**names, "AS_DATA_DIR": str(tmp_path / "faust-data")}
    grant(secured, printed_acls("tests.security.faust_app:durable", "User:worker", env))
    create_topics(secured.admin_bootstrap, [names["AS_INPUT"]], partitions=2)
    env.update(secured.client_files("worker", tmp_path / "conf"))
    proc = WorkerProcess(
        "", broker="", data_dir="", log_file=tmp_path / "faust.log", env=env, cwd=ROOT
    )
    proc.cmd = [sys.executable, "-m", "tests.security.faust_app", "worker", "-l", "info"]
    proc.start()
    try:
        produce(secured.admin_bootstrap, names["AS_INPUT"], [(f"k{n}", {"n": n}) for n in range(4)])
        out = wait_for_records(secured.admin_bootstrap, names["AS_OUTPUT"], 4, timeout=120)
        assert sorted(r.json()["n"] for r in out) == [0, 1, 2, 3]
        journal = f"{names['AS_APP_ID']}-action-state"
        assert wait_for_records(secured.admin_bootstrap, journal, 8, timeout=30)
    finally:
        code = proc.terminate()
    log = proc.log()
    assert code == 0, log
    assert_no_password(secured, {"faust log": log})


def test_spark_audit_and_backfill(secured, names, tmp_path):
    """One test for both jobs (each CLI run starts Spark: ~20 s)."""
    pytest.importorskip("pyspark")
    env = secured_setup(secured, names, tmp_path)
    connect(env["AS_EFFECTS_DB"]).close()
    source, out = names["AS_INPUT"], names["AS_OUTPUT"]
    worker = WorkerProcess(
        APP, broker=secured.url, data_dir=tmp_path / "data", env=env,
        log_file=tmp_path / "worker.log", cwd=ROOT, extra_args=["--worker-id", "w1"],
    ).start()  # fmt: skip
    produce(secured.admin_bootstrap, source, [(f"c{i % 3}", {"order": f"o{i}"}) for i in range(4)])
    assert len(wait_for_records(secured.admin_bootstrap, out, 4, timeout=90)) == 4, worker.log()
    time.sleep(1.0)  # a commit meanwhile
    assert worker.terminate() == 0, worker.log()
    # Inputs the group never ran: what a backfill is for.
    produce(
        secured.admin_bootstrap, source, [(f"c{i % 3}", {"order": f"o{i}"}) for i in range(4, 7)]
    )
    spark_env = {**env, "PYSPARK_PYTHON": sys.executable, "JAVA_TOOL_OPTIONS": ""}

    audit = cli(spark_env, "spark", "audit", "-A", APP, "--master", "local[2]",
                "--out", str(tmp_path / "audit"), "--loglevel", "info")  # fmt: skip
    assert audit.returncode == 0, audit.stderr[-3000:]
    summary = json.loads(audit.stdout)
    assert summary["calls_pending"] == 0, summary
    backfill = cli(spark_env, "spark", "backfill", "-A", APP, "--master", "local[2]",
                   "--output-topic", out, "--write-journal", "--loglevel", "info")  # fmt: skip
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    receipts = wait_for_records(secured.admin_bootstrap, out, 7, timeout=30)
    assert sorted(r.json()["order"] for r in receipts) == [f"o{i}" for i in range(7)]
    assert_no_password(secured, {
        "worker log": worker.log(),
        "spark audit": audit.stdout + audit.stderr,
        "spark backfill": backfill.stdout + backfill.stderr,
    })  # fmt: skip
