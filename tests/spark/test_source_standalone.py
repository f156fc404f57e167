"""The generic Kafka data source stands alone: it pulls in no part of an agents_stream app.

``agents_stream/__init__`` imports the public API (App, the durable core), which would
hide any such dependency of the source; the subprocess therefore registers a bare
``agents_stream`` package (its ``__path__`` only, ``__init__`` not run), so what ends up
in ``sys.modules`` is exactly what the source's own modules import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import agents_stream

FORBIDDEN = (
    "agents_stream.app",
    "agents_stream.durable",
    "agents_stream.serde",
    "agents_stream.state",
    "agents_stream.runtime",
)

_PROBE = """
import json, sys, types
package = types.ModuleType("agents_stream")
package.__path__ = [sys.argv[1]]
sys.modules["agents_stream"] = package

import agents_stream.spark.source as source
from agents_stream.spark.source import (
    KafkaDataSource, KafkaSourceOptions, OffsetRange, arrow_schema, plan_ranges,
    read_kafka, read_range, source_options,
)
from agents_stream.spark import session  # registers the source for agents_stream jobs

options = KafkaSourceOptions.from_options(source_options("localhost:9", "orders"))
schema = KafkaDataSource(dict(source_options("localhost:9", "orders"))).schema()
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("agents_stream")),
    "columns": schema.fieldNames(),
    "topics": list(options.topics),
}))
"""


def test_source_imports_nothing_of_the_app_side() -> None:
    package_dir = str(Path(agents_stream.__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, package_dir],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = report["modules"]
    assert "agents_stream.spark.source.datasource" in loaded
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == [], f"the generic source imported {bad}"
    assert report["columns"][:5] == ["key", "value", "topic", "partition", "offset"]
    assert report["topics"] == ["orders"]


def test_the_flat_module_paths_of_0_1_0_are_gone() -> None:
    """The aliases of the unreleased 0.1.0 were deleted (issue 41): one import path per
    module."""
    import importlib

    for old in ("kafka_source", "options", "offsets", "record_reader", "action_state",
                "journal_rows", "state_writer"):  # fmt: skip
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"agents_stream.spark.{old}")
