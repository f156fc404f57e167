"""``agents-stream acls``: the ACLs an app needs, from the app (no cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents_stream.cli.acls import app_acls
from examples.payments import app

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agents_stream", "acls", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_every_topic_the_worker_touches_and_its_group():
    acls: dict[tuple[str, str], set[str]] = {}
    for a in app_acls(app):
        acls.setdefault((a.resource, a.name), set()).update(a.operations)
    # Write on the input: `dlq replay` produces dead letters back to it.
    assert acls[("topic", "orders")] == {"Read", "Describe", "Create", "Write"}
    assert acls[("topic", "orders-dlq")] == {"Write", "Read", "Describe", "Create"}
    assert acls[("topic", "receipts")] == {"Write", "Read", "Describe", "Create"}
    assert acls[("topic", "payments-action-state")] >= {"Write", "Read", "DescribeConfigs"}
    assert acls[("group", "payments")] == {"Read", "Describe"}
    # The readers' throwaway groups (cache rebuild, CLI, Spark): a coordinator lookup.
    [readers] = [a for a in app_acls(app) if a.pattern == "prefixed"]
    assert (readers.resource, readers.name, readers.operations) == (
        "group", "agents-stream-", ("Describe",)
    )  # fmt: skip
    assert len(acls) == 6
    assert all("Create" not in a.operations for a in app_acls(app, create_topics=False))


def test_transactional_ids_only_with_exactly_once(monkeypatch):
    assert not [a for a in app_acls(app) if a.resource == "transactional-id"]
    monkeypatch.setattr(app, "processing_guarantee", "exactly_once", raising=False)
    [txn] = [a for a in app_acls(app) if a.resource == "transactional-id"]
    assert (txn.name, txn.pattern, set(txn.operations)) == (
        "payments-", "prefixed", {"Write", "Describe"}
    )  # fmt: skip


def test_commands_and_table():
    out = cli("-A", "examples.payments:app", "--principal", "User:pay", "--bootstrap", "k:9093")
    assert out.returncode == 0, out.stderr
    commands = [ln for ln in out.stdout.splitlines() if ln.startswith("kafka-acls ")]
    assert len(commands) == 7
    assert (
        "kafka-acls --bootstrap-server k:9093 --add --allow-principal User:pay "
        "--operation Read --operation Describe --operation Create --topic orders"
    ) in commands
    assert any(c.endswith("--group payments") for c in commands)
    assert (
        "kafka-acls --bootstrap-server k:9093 --add --allow-principal User:pay "
        "--operation Describe --resource-pattern-type prefixed --group agents-stream-"
    ) in commands
    table = cli("-A", "examples.payments:app", "--format", "table", "--no-create")
    assert table.returncode == 0 and "Create" not in table.stdout
    assert "topic payments-action-state" in table.stdout


def test_bad_input_is_one_line():
    bad = cli("-A", "examples.payments:app", "--principal", "payments")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "User:NAME" in bad.stderr
    missing = cli("-A", "nope.module:app")
    assert missing.returncode == 1 and "cannot import" in missing.stderr


def test_faust_durable_agent(monkeypatch):
    """-A may name a Faust app's durable_agent(...): its topics plus Faust's own."""
    pytest.importorskip("faust")
    env = {"AS_APP_ID": "fa", "AS_INPUT": "fin", "AS_OUTPUT": "fout"}
    out = subprocess.run(
        [sys.executable, "-m", "agents_stream", "acls", "-A", "tests.security.faust_app:durable",
         "--format", "table", "--no-create"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {" ".join(ln.split()[:2]): ln.split()[2] for ln in out.stdout.splitlines()}
    assert rows["topic fa-action-state"] == "Write,Read,Describe,DescribeConfigs"
    assert rows["topic fa-__assignor-__leader"] == "Write,Read,Describe"
    assert rows["group fa"] == "Read,Describe" and rows["topic fin-dlq"]
