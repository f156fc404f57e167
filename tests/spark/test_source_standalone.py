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


def test_old_flat_module_paths_are_aliases_of_the_new_modules() -> None:
    import importlib

    moved = {
        "kafka_source": "source.datasource",
        "options": "source.options",
        "offsets": "source.offsets",
        "record_reader": "source.record_reader",
        "action_state": "frames.action_state",
        "journal_rows": "frames.journal_rows",
        "state_writer": "frames.state_writer",
    }
    for old, new in moved.items():
        alias = importlib.import_module(f"agents_stream.spark.{old}")
        module = importlib.import_module(f"agents_stream.spark.{new}")
        public = [n for n in vars(module) if not n.startswith("_")]
        assert alias.__all__, old
        for name in alias.__all__:
            assert getattr(alias, name) is getattr(module, name), f"{old}.{name}"
        # Everything the module had when it moved (names added since need no old path).
        assert set(alias.__all__) <= set(public), old
