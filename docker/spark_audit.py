"""Entry script of the compose ``spark-job`` service: run the Spark audit of an app.

A thin wrapper around :func:`agents_stream.spark.jobs.audit.run_audit` (read-only: no
writes to Kafka, no offsets committed), for images where the ``agents-stream spark``
command is not available. Writes Parquet tables, ``summary.json``, ``report.md`` and
``report.html`` under ``--out`` and prints the summary::

    python docker/spark_audit.py -A examples.payments:app --out /reports [--broker URL]
"""

from __future__ import annotations

import argparse
import json
import sys

from agents_stream.cli.common import load_app
from agents_stream.errors import ConfigurationError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-A", "--app", required=True, help="the App, as module:attribute")
    parser.add_argument("-b", "--broker", default=None, help="overrides AGENTS_STREAM_BROKER")
    parser.add_argument("--out", default="/reports", help="directory of tables and reports")
    parser.add_argument(
        "--stuck-after", type=float, default=300.0, help="seconds after which PENDING is stuck"
    )
    args = parser.parse_args(argv)

    from agents_stream.spark import get_spark
    from agents_stream.spark.jobs.audit import run_audit

    app = load_app(args.app)
    bootstrap = app.resolve_broker(args.broker)
    if not bootstrap:
        raise ConfigurationError("no broker: pass --broker or set AGENTS_STREAM_BROKER")
    spark = get_spark(f"{app.id}-audit")
    try:
        result = run_audit(spark, app, bootstrap, args.out, stuck_after_s=args.stuck_after)
        print(json.dumps(result.summary, indent=2, default=str))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
