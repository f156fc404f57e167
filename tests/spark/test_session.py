"""Session helpers: Java detection and PySpark-free imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agents_stream.errors import AgentsStreamError
from agents_stream.spark import SparkUnavailableError, check_java


def test_missing_java_names_what_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkUnavailableError, match="openjdk-17-jre-headless") as info:
        check_java()
    assert isinstance(info.value, AgentsStreamError)


def test_old_java_is_rejected(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'openjdk version \"1.8.0_392\"' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SparkUnavailableError, match="Java 8"):
        check_java()


def test_importing_the_package_does_not_import_pyspark() -> None:
    code = (
        "import sys, agents_stream, agents_stream.spark as s;"
        "s.OffsetRange; s.KafkaSourceOptions; s.SparkUnavailableError; s.plan_ranges;"
        "s.read_range; s.source_options;"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
