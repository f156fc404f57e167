"""``agents-stream spark ...`` commands, run in-process on the test session."""

from __future__ import annotations

import json
import sys
import time

import pytest

from agents_stream.cli.main import build_parser, main
from agents_stream.testing.topics import create_topics
from tests.spark.workload import SparkAppEnv, craft_anomalies

APP_MODULE = """
from agents_stream import App
from tests.apps.spark_app import Pipeline

app = App({app_id!r}, prune_completed=False, partitions=2)
app.agent(Pipeline, input={input!r}, output={output!r})
"""


def test_spark_commands_are_registered():
    parser = build_parser()
    for job in ("audit", "backfill", "reconcile"):
        args = parser.parse_args(
            ["spark", job, "-A", "m:app", *(["--ledger", "x"] if job == "reconcile" else [])]
        )
        assert args.spark_command == job and callable(args.func)
    two_phase = parser.parse_args(["spark", "reconcile", "-A", "m:app", "--two-phase"])
    assert two_phase.two_phase and two_phase.ledger is None  # no ledger: two-phase only


def test_reconcile_needs_a_ledger_or_two_phase(capsys):
    assert main(["spark", "reconcile", "-A", "m:app"]) == 2
    assert "give --ledger (PENDING calls), --two-phase, or both" in capsys.readouterr().err


@pytest.mark.broker
@pytest.mark.spark
def test_cli_audit_and_dry_run_reconcile(
    spark, broker, topic_factory, tmp_path, monkeypatch, capsys
):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    create_topics(broker.bootstrap, [f"{env.app_id}-action-state"], partitions=2)
    craft_anomalies(env, int(time.time() * 1000))
    module = f"cli_app_{env.app_id.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        APP_MODULE.format(app_id=env.app_id, input=env.input, output=env.output)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    common = ["-A", f"{module}:app", "--broker", broker.url, "--loglevel", "warning"]

    assert main(["spark", "audit", *common, "--out", str(tmp_path / "a"), "--no-outputs"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["stuck_calls"], summary["calls_pending"], summary["truncations"]) == (1, 2, 1)
    assert (tmp_path / "a" / "report.html").exists()

    ledger = tmp_path / "ledger.csv"
    ledger.write_text(
        f'call_id,status,result\n{env.app_id}:s1:1000:Pipeline.process#0:0,SUCCEEDED,"{{""ok"": 1}}"\n'
    )
    rc = main(
        ["spark", "reconcile", *common, "--ledger", str(ledger), "--dry-run", "--missing", "fail"]
    )
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)
    assert (rec["pending"], rec["succeeded"], rec["failed"], rec["written"]) == (2, 1, 1, 0)
    assert "tests" in sys.modules  # the app module imported the test app's agent
