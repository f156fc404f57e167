"""Local or cluster SparkSession for agents_stream jobs, with our data sources registered."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import SparkUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER_ENV = "AGENTS_STREAM_SPARK_MASTER"
"""Environment variable overriding the default master (``local[*]``)."""

MIN_JAVA = 17
_JAVA_HINT = "install OpenJDK 17: apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"


def check_java() -> str:
    """Checks that a Java runtime PySpark can use is installed.

    Returns:
        The path of the ``java`` executable found (``$JAVA_HOME/bin/java`` first).

    Raises:
        SparkUnavailableError: no ``java``, or one older than Java 17; the message says
            what to install.
    """
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "java") if java_home else None
    java = str(candidate) if candidate and candidate.exists() else shutil.which("java")
    if java is None:
        raise SparkUnavailableError(
            f"Spark jobs need Java {MIN_JAVA}+ and none was found: {_JAVA_HINT}"
        )
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkUnavailableError(f"cannot run {java}: {exc}; {_JAVA_HINT}") from exc
    # `java -version` prints to stderr, e.g. 'openjdk version "17.0.15"' or '"1.8.0_392"'.
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(2)) if match.group(1) == "1" else int(match.group(1))
        if major < MIN_JAVA:
            raise SparkUnavailableError(
                f"{java} is Java {major}; PySpark 4 needs Java {MIN_JAVA}+: {_JAVA_HINT}"
            )
    return java


def get_spark(
    app_name: str = "agents-stream",
    master: str | None = None,
    *,
    jars: Sequence[str | Path] = (),
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Returns the active SparkSession, creating it if needed, with our sources registered.

    The Python workers run the current interpreter (``PYSPARK_PYTHON``), so executors
    import the same agents_stream and confluent-kafka as the driver. Logs are reduced to
    warnings and shuffles use few partitions, which suits local jobs; cluster settings
    come from ``spark-submit`` / ``spark-defaults.conf`` as usual.

    Args:
        app_name: Spark application name.
        master: Spark master URL; defaults to ``$AGENTS_STREAM_SPARK_MASTER`` or
            ``local[*]``. Ignored when a session is already active.
        jars: local jars for the session's classpath (``spark.jars``), e.g. Spark's own
            Kafka connector (:mod:`agents_stream.spark.official_connector`). Ignored when
            a session is already active.
        conf: further Spark settings (``spark.archives``, ``spark.executor.memory``...),
            applied last. Ignored when a session is already active.

    Raises:
        SparkUnavailableError: PySpark or Java is missing.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise SparkUnavailableError(
            "PySpark is not installed: pip install 'agents-stream[spark]'"
        ) from exc
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or os.environ.get(MASTER_ENV) or "local[*]"
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    if master.startswith("local"):
        # A local job never leaves the machine; binding to loopback avoids the JVM's
        # hostname lookup (and its warning) on hosts whose name maps to 127.0.1.1.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_data_sources(spark)
    return spark


def register_data_sources(spark: SparkSession) -> None:
    """Registers ``agents_stream.kafka`` and ``agents_stream.journal`` with ``spark``
    (idempotent)."""
    from .frames.journal_source import JournalDataSource
    from .source.datasource import KafkaDataSource

    register_once(spark, KafkaDataSource)
    register_once(spark, JournalDataSource)


def register_once(spark: SparkSession, source: type) -> None:
    """Registers a Python data source with ``spark`` unless this session has it already
    (Spark warns on the terminal at every registration after the first)."""
    done: set[str] = spark.__dict__.setdefault("_agents_stream_sources", set())
    name = f"{source.__module__}.{source.__qualname__}"
    if name not in done:
        spark.dataSource.register(source)
        done.add(name)
