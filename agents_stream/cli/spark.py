"""``agents-stream spark audit|backfill|reconcile -A module:app``: Spark batch jobs.

Each command builds (or reuses) a SparkSession (``--master``, default
``$AGENTS_STREAM_SPARK_MASTER`` or ``local[*]``), runs the job in
:mod:`agents_stream.spark.jobs`, logs its steps and prints a JSON summary on stdout.
The same commands run under ``spark-submit``::

    spark-submit agents_stream/spark/jobs/__main__.py audit -A myapp:app --out audit/

PySpark is imported only when a command runs, so the rest of the CLI works without it.
Exit codes: 0 done, 1 failed (the error is printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import AgentsStreamError
from .common import add_app_args, app_and_broker, positive_int, setup_logging


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("spark", help="Spark batch jobs: audit, backfill, reconcile")
    sub = parser.add_subparsers(dest="spark_command", metavar="JOB", required=True)

    audit = sub.add_parser("audit", help="audit the ActionState, input and output topics")
    _common(audit)
    audit.add_argument("--out", default="agents-stream-audit", help="output directory")
    audit.add_argument(
        "--stuck-after", type=float, default=300.0,
        help="a PENDING call older than this many seconds is stuck (default 300)",
    )  # fmt: skip
    audit.add_argument("--no-inputs", action="store_true", help="skip the input topic join")
    audit.add_argument("--no-outputs", action="store_true", help="skip duplicate outputs")
    audit.add_argument(
        "--max-records-per-partition", type=int, default=None,
        help="split ActionState partitions into Spark tasks of at most this many offsets",
    )  # fmt: skip
    audit.set_defaults(func=run_audit)

    backfill = sub.add_parser("backfill", help="run an agent over an input topic range")
    _common(backfill)
    backfill.add_argument("--agent", default=None, help="agent class name (several agents)")
    backfill.add_argument(
        "--from", dest="starting", default="earliest",
        help='first offsets: earliest or Spark JSON {"topic":{"0":23}}',
    )  # fmt: skip
    backfill.add_argument(
        "--to", dest="ending", default="latest", help="end offsets (exclusive): latest or JSON"
    )
    backfill.add_argument("--output-path", default=None, help="write outputs as Parquet")
    backfill.add_argument(
        "--output-topic", default=None,
        help="produce outputs to this topic (the agent's own: only those not in it yet, "
        "marked emitted with --write-journal)",
    )  # fmt: skip
    backfill.add_argument(
        "--app-id", default=None, help="journal under another app id (separate ActionState)"
    )
    backfill.add_argument(
        "--no-journal", action="store_true", help="ignore the ActionState snapshot"
    )
    backfill.add_argument(
        "--write-journal", action="store_true",
        help="append new journal entries to the ActionState topic (workers must be stopped)",
    )  # fmt: skip
    backfill.add_argument(
        "--concurrency", type=positive_int, default=64, metavar="N",
        help="records of distinct keys each task runs at once, a key's in offset order "
        "(default 64; 1: one at a time)",
    )  # fmt: skip
    backfill.add_argument(
        "--rerun-completed", action="store_true",
        help="DANGER: also run inputs the worker group already finished (charges them again)",
    )  # fmt: skip
    backfill.set_defaults(func=run_backfill)

    rec = sub.add_parser(
        "reconcile",
        help="settle PENDING calls from a ledger (stop the app's workers first)",
    )
    _common(rec)
    rec.add_argument("--ledger", required=True, help="ledger file or directory (Parquet/CSV)")
    rec.add_argument("--ledger-format", choices=["parquet", "csv"], default=None)
    rec.add_argument("--id-column", default="call_id", help="ledger column to match on")
    rec.add_argument(
        "--match-on", choices=["call_id", "key"], default="call_id",
        help="match the id column against the call id or the record key",
    )  # fmt: skip
    rec.add_argument("--status-column", default="status")
    rec.add_argument("--result-column", default="result")
    rec.add_argument("--error-type-column", default="error_type")
    rec.add_argument("--error-message-column", default="error_message")
    rec.add_argument(
        "--missing", choices=["skip", "fail"], default="skip",
        help="PENDING calls absent from the ledger: leave PENDING (skip) or settle FAILED",
    )  # fmt: skip
    rec.add_argument("--dry-run", action="store_true", help="decide and report, write nothing")
    rec.add_argument("--force", action="store_true", help="skip the stopped-workers check")
    rec.add_argument("--out", default=None, help="directory for decisions.parquet and summary")
    rec.set_defaults(func=run_reconcile)


def _common(parser: argparse.ArgumentParser) -> None:
    add_app_args(parser)
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")


def _session(args: argparse.Namespace) -> tuple[Any, Any, str]:
    from ..spark.session import check_java, get_spark, register_data_sources

    setup_logging(args.loglevel)
    app, bootstrap = app_and_broker(args)
    name = f"agents-stream-{args.spark_command}-{app.id}"
    if os.environ.get("PYSPARK_GATEWAY_PORT") and not args.master:
        # Under spark-submit: keep the master and resources spark-submit configured.
        from pyspark.sql import SparkSession

        check_java()
        spark = SparkSession.builder.appName(name).getOrCreate()
        register_data_sources(spark)
    else:
        spark = get_spark(name, master=args.master)
    return spark, app, bootstrap


def _run(args: argparse.Namespace, job: Any) -> int:
    try:
        spark, app, bootstrap = _session(args)
        summary = job(spark, app, bootstrap)
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2, default=str))
    return 0


def run_audit(args: argparse.Namespace) -> int:
    def job(spark: Any, app: Any, bootstrap: str) -> dict[str, Any]:
        from ..spark.jobs.audit import run_audit as audit

        options = {}
        if args.max_records_per_partition:
            options["maxRecordsPerPartition"] = args.max_records_per_partition
        result = audit(
            spark, app, bootstrap, args.out, stuck_after_s=args.stuck_after,
            inputs=not args.no_inputs, outputs=not args.no_outputs, **options,
        )  # fmt: skip
        return {**result.summary, "reports": [str(p) for p in result.reports]}

    return _run(args, job)


def run_backfill(args: argparse.Namespace) -> int:
    def job(spark: Any, app: Any, bootstrap: str) -> dict[str, Any]:
        from ..spark.jobs.backfill import run_backfill as backfill

        result = backfill(
            spark, app, bootstrap, agent=args.agent, starting=args.starting,
            ending=args.ending, output_path=args.output_path, output_topic=args.output_topic,
            app_id=args.app_id, use_journal=not args.no_journal,
            write_journal=args.write_journal, rerun_completed=args.rerun_completed,
            concurrency=args.concurrency,
        )  # fmt: skip
        return {**result.summary, "written": result.written}

    return _run(args, job)


def run_reconcile(args: argparse.Namespace) -> int:
    def job(spark: Any, app: Any, bootstrap: str) -> dict[str, Any]:
        from ..spark.jobs.reconcile import Ledger
        from ..spark.jobs.reconcile import run_reconcile as reconcile

        ledger = Ledger(
            args.ledger, format=args.ledger_format, id_column=args.id_column,
            match_on=args.match_on, status_column=args.status_column,
            result_column=args.result_column, error_type_column=args.error_type_column,
            error_message_column=args.error_message_column,
        )  # fmt: skip
        result = reconcile(
            spark, app, bootstrap, ledger, missing=args.missing, dry_run=args.dry_run,
            force=args.force, out_dir=args.out,
        )  # fmt: skip
        return result.summary

    return _run(args, job)
