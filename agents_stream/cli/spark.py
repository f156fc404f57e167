"""``agents-stream spark audit|backfill|reconcile -A module:app``: Spark batch jobs.

Each command builds (or reuses) a SparkSession (``--master``, default
``$AGENTS_STREAM_SPARK_MASTER`` or ``local[*]``; ``spark://``, ``yarn``, ``k8s://`` as
for ``spark-submit``), ships the app's own modules to a cluster's executors and checks
they import it (:mod:`agents_stream.spark.shipping`), runs the job in
:mod:`agents_stream.spark.jobs`, logs its steps and prints a JSON summary on stdout. The
same commands run under ``spark-submit``, whose session (master, executors, ``--py-files``,
``--archives``) the job then uses::

    spark-submit --master spark://host:7077 "$(agents-stream spark entrypoint)" \
        audit -A myapp:app --out audit/

A failed job prints one line on stderr: the first executor error (type, message, and the
record it was on) and the file holding the full trace; the driver JVM's log goes to that
file too (:mod:`agents_stream.spark.failures`). PySpark is imported only when a command
runs, so the rest of the CLI works without it. Exit codes: 0 done, 1 failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import AgentsStreamError
from .common import add_app_args, app_and_broker, positive_int, setup_logging

log = logging.getLogger("agents_stream.spark.jobs")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "spark",
        help="Spark batch jobs: audit, backfill, reconcile",
        description="Spark batch jobs over an app's topics, on local[*] or a cluster "
        "(--master spark://..., yarn, k8s://...; or under spark-submit: see entrypoint).",
    )
    sub = parser.add_subparsers(dest="spark_command", metavar="JOB", required=True)

    entry = sub.add_parser(
        "entrypoint",
        help="print the script spark-submit runs: spark-submit [options] SCRIPT JOB -A ...",
        description="Prints the path of the jobs' entry script, for spark-submit: "
        'spark-submit --master spark://host:7077 "$(agents-stream spark entrypoint)" '
        "backfill -A myapp:app --output-path out/",
    )
    entry.set_defaults(func=run_entrypoint)

    audit = sub.add_parser(
        "audit",
        help="audit the ActionState, input and output topics",
        description="Audits an app's journal: calls run twice, stuck PENDING calls, "
        "truncations, inputs never journaled, duplicate outputs (read-only).",
    )
    _common(audit)
    audit.add_argument("--out", default="agents-stream-audit", help="output directory")
    audit.add_argument(
        "--stuck-after", type=float, default=300.0,
        help="a PENDING call older than this many seconds is stuck, and so is a two-phase "
        "call prepared that long ago that still owes its commit or abort (default 300)",
    )  # fmt: skip
    audit.add_argument("--no-inputs", action="store_true", help="skip the input topic join")
    audit.add_argument("--no-outputs", action="store_true", help="skip duplicate outputs")
    audit.add_argument(
        "--max-records-per-partition", type=int, default=None,
        help="split ActionState partitions into Spark tasks of at most this many offsets",
    )  # fmt: skip
    audit.set_defaults(func=run_audit)

    backfill = sub.add_parser(
        "backfill",
        help="run an agent over an input topic range",
        description="Runs an agent over a range of its input topic on Spark executors, "
        "replaying what its journal holds and skipping inputs its workers finished.",
    )
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
        help="settle PENDING calls from a ledger, two-phase calls left open (stop the "
        "app's workers first)",
        description="Settles an app's PENDING calls from an external ledger (Parquet or "
        "CSV) by journaling their results and, with --two-phase, commits or aborts the "
        "two-phase calls left open by the rules the workers follow; the app's workers "
        "must be stopped.",
    )
    _common(rec)
    rec.add_argument(
        "--ledger", default=None,
        help="ledger file or directory (Parquet/CSV); required unless --two-phase",
    )  # fmt: skip
    rec.add_argument(
        "--two-phase", action="store_true",
        help="also settle open two-phase calls (PREPARED, ABORTING): commit those whose "
        "record completed below its partition's completed-through marker, abort the "
        "others below it and those whose abort was decided; calls their commit/abort here",
    )  # fmt: skip
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
    parser.add_argument(
        "--master", default=None,
        help="Spark master: local[*] (default, or $AGENTS_STREAM_SPARK_MASTER), "
        "spark://host:7077, yarn, k8s://...",
    )  # fmt: skip
    parser.add_argument(
        "--py-files", type=_comma_list, default=[], metavar="FILES",
        help="comma-separated .py/.zip/.egg files for the executors' Python path, besides "
        "the app's own modules (shipped by themselves)",
    )  # fmt: skip
    parser.add_argument(
        "--archives", type=_comma_list, default=[], metavar="ARCHIVES",
        help="comma-separated archives unpacked in each executor's directory (spark.archives)"
        ", e.g. a packed venv: env.tar.gz#env with PYSPARK_PYTHON=./env/bin/python",
    )  # fmt: skip
    parser.add_argument(
        "--conf", action="append", type=_spark_conf, default=[], metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--log-dir", default=None,
        help="folder of the job's log file (the driver JVM's log and a failure's full "
        "trace; default <temp dir>/agents-stream)",
    )  # fmt: skip


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _spark_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _required_topics(args: argparse.Namespace, app: Any) -> dict[str, str]:
    """The topics the job cannot run without, checked before a JVM starts."""
    if args.spark_command == "backfill":
        from ..spark.jobs.backfill import pick_binding

        binding = app.agents[pick_binding(app, args.agent)]
        return {binding.input: f"the input of agent {binding.name}"}
    return {app.action_state_topic: f"the journal of app {app.id!r}"}


def _session(args: argparse.Namespace, app: Any, log_path: Path) -> Any:
    from ..spark.failures import log4j_config
    from ..spark.session import check_java, get_spark, register_data_sources

    name = f"agents-stream-{args.spark_command}-{app.id}"
    conf = dict(args.conf)
    if args.archives:
        conf["spark.archives"] = ",".join(args.archives)
    # A driver JVM started here logs into the job's file from its first line.
    options = conf.get("spark.driver.extraJavaOptions", "")
    conf["spark.driver.extraJavaOptions"] = (
        f"{options} -Dlog4j2.configurationFile=file:{log4j_config(log_path)}".strip()
    )
    if os.environ.get("PYSPARK_GATEWAY_PORT") and not args.master:
        # Under spark-submit: keep the master and resources spark-submit configured.
        from pyspark.sql import SparkSession

        check_java()
        builder = SparkSession.builder.appName(name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        register_data_sources(spark)
    else:
        spark = get_spark(name, master=args.master, conf=conf)
    return spark


def _spark_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's report of a failed job (Py4J, or a captured error)."""
    try:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException
    except ImportError:
        return False
    return isinstance(exc, Py4JError | PySparkException)


def _run(args: argparse.Namespace, job: Any) -> int:
    from ..spark.failures import first_error_line, job_log_path, route_jvm_log, write_trace
    from ..spark.jobs.common import require_topics
    from ..spark.shipping import ship

    log_path = None
    try:
        setup_logging(args.loglevel, tool=True)
        logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO is the gateway's chatter
        app, bootstrap = app_and_broker(args)
        require_topics(bootstrap, _required_topics(args, app))
        log_path = job_log_path(args.spark_command, app.id, args.log_dir)
        spark = _session(args, app, log_path)
        if route_jvm_log(spark, log_path):
            log.info("spark: the driver JVM's log (and a failure's full trace): %s", log_path)
        ship(spark.sparkContext, [], args.py_files)  # the job ships the app's own modules
        summary = job(spark, app, bootstrap)
    except AgentsStreamError as exc:
        write_trace(log_path, exc)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        if not _spark_failure(exc):
            raise
        write_trace(log_path, exc)
        where = f"; full trace in {log_path}" if log_path else ""
        print(
            f"error: spark {args.spark_command} failed: {first_error_line(exc, log_path)}{where}",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(summary, indent=2, default=str))
    return 0


def run_entrypoint(args: argparse.Namespace) -> int:
    from ..spark.jobs import __main__ as entry

    print(entry.__file__)
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
    if args.ledger is None and not args.two_phase:
        print("error: give --ledger (PENDING calls), --two-phase, or both", file=sys.stderr)
        return 2

    def job(spark: Any, app: Any, bootstrap: str) -> dict[str, Any]:
        from ..spark.jobs.reconcile import Ledger
        from ..spark.jobs.reconcile import run_reconcile as reconcile

        ledger = None
        if args.ledger is not None:
            ledger = Ledger(
                args.ledger, format=args.ledger_format, id_column=args.id_column,
                match_on=args.match_on, status_column=args.status_column,
                result_column=args.result_column, error_type_column=args.error_type_column,
                error_message_column=args.error_message_column,
            )  # fmt: skip
        result = reconcile(
            spark, app, bootstrap, ledger, missing=args.missing, dry_run=args.dry_run,
            force=args.force, out_dir=args.out, two_phase=args.two_phase,
        )  # fmt: skip
        return result.summary

    return _run(args, job)
