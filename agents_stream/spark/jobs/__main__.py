"""Entry point for ``spark-submit`` and ``python -m agents_stream.spark.jobs``.

``spark-submit agents_stream/spark/jobs/__main__.py audit -A myapp:app --out audit/``
runs the same job as ``agents-stream spark audit -A myapp:app --out audit/``; the
session spark-submit configures (master, executors) is the one the job uses.
"""

from __future__ import annotations

import sys

from agents_stream.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["spark", *sys.argv[1:]]))
