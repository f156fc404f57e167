"""A failed Spark job as one line on the terminal, its traces in a log file.

A task that raises on an executor reaches the driver as a Py4J or captured exception whose
text is a JVM stack trace wrapped around the executor's Python traceback (a hundred lines
for one ``ModuleNotFoundError``), and Spark's scheduler logs the same trace again, at WARN,
once per attempt. A user needs the first executor error: its type and message, and the
record it was on. Two parts give them that:

- :func:`route_jvm_log` points the driver JVM's log4j at a file (every level from INFO, with
  its traces); the terminal keeps the JVM's one-line warnings (an executor that cannot get
  resources, say) and loses the multi-line ones and the scheduler's per-attempt failures.
- :func:`first_error_line` digs the executor's exception out of the text: the last Python
  exception line of its traceback (a :class:`~.errors.TaskRecordError` names topic,
  partition and offset), else the Java exception of the stage failure's "most recent
  failure".
"""

from __future__ import annotations

import re
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["first_error_line", "job_log_path", "log4j_config", "route_jvm_log", "write_trace"]

_LOG4J2 = """\
# Written by agents_stream.spark.failures: the JVM's log of one agents-stream Spark job.
status = error
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
rootLogger.appenderRef.console.ref = console
rootLogger.appenderRef.console.level = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c: %m%n%ex
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n
appender.console.layout.alwaysWriteExceptions = false
# A message of several lines is a trace (a lost task's Python traceback): the file has it.
appender.console.filter.traces.type = RegexFilter
appender.console.filter.traces.regex = (?s).*[\\r\\n].*
appender.console.filter.traces.onMatch = DENY
appender.console.filter.traces.onMismatch = NEUTRAL
# Per-attempt task failures and the executor's own report of them: the job's error says
# the first one, once.
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = info
logger.tasks.additivity = false
logger.tasks.appenderRef.file.ref = file
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = info
logger.executor.additivity = false
logger.executor.appenderRef.file.ref = file
logger.python.name = org.apache.spark.api.python
logger.python.level = info
logger.python.additivity = false
logger.python.appenderRef.file.ref = file
"""


def job_log_path(job: str, app_id: str, log_dir: str | Path | None = None) -> Path:
    """Where one job's JVM log goes: ``<log_dir>/spark-<job>-<app>-<UTC time>.log``
    (``log_dir`` defaults to ``<temp dir>/agents-stream``)."""
    folder = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "agents-stream"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", app_id)
    return folder / f"spark-{job}-{safe}-{stamp}.log"


def log4j_config(path: Path) -> Path:
    """Writes the log4j 2 configuration that logs into ``path`` (beside it); returns it.

    Given to a JVM that has yet to start (``-Dlog4j2.configurationFile``), it keeps even
    Spark's start-up lines off the terminal; :func:`route_jvm_log` applies it to one that
    runs (under ``spark-submit``).
    """
    config = path.with_suffix(".log4j2.properties")
    config.write_text(_LOG4J2.format(path=str(path).replace("\\", "/")))
    return config


def route_jvm_log(spark: SparkSession, path: Path) -> bool:
    """Reconfigures the driver JVM's log4j: everything into ``path``, the terminal only one-
    line warnings. Returns whether it took (a JVM without log4j 2 keeps its own setup)."""
    config = log4j_config(path)
    try:
        jvm: Any = spark.sparkContext._jvm
        uri = jvm.java.io.File(str(config)).toURI()
        jvm.org.apache.logging.log4j.core.config.Configurator.reconfigure(uri)
    except Exception:  # keep Spark's own logging rather than fail the job
        return False
    return True


def write_trace(path: Path | None, exc: BaseException) -> None:
    """Appends ``exc``'s Python traceback (and the JVM text it carries) to the job's log."""
    if path is None:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write("\n=== the job's error, as the driver saw it ===\n")
        out.write("".join(traceback.format_exception(exc)))


_TRACEBACK = "Traceback (most recent call last):"
_LOST = re.compile(
    r"most recent failure: Lost (task \S+ in stage \S+) \(TID \d+\) \(([^)]*)\): (.*)"
)
_JVM_FRAME = re.compile(r"^\s+at \S")
_NOISE = (" SQLSTATE:", "JVM stacktrace:")


def _python_error(lines: list[str]) -> str | None:
    """The exception line that ends the last Python traceback in ``lines``."""
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(_TRACEBACK)]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if not line.strip() or line.startswith((" ", "\t")):
            continue  # a frame, its source line, the carets
        return _short_type(line.strip())
    return None


def _short_type(line: str) -> str:
    """``a.b.ValueError: x`` -> ``ValueError: x``; a bracketed Spark class is kept."""
    head, sep, rest = line.partition(": ")
    if sep and re.fullmatch(r"[\w.]+", head) and "." in head:
        return f"{head.rsplit('.', 1)[1]}: {rest}"
    return line


_LOST_IN_LOG = re.compile(r"Lost (task \S+ in stage \S+) \(TID \d+\) \(([^)]*)\)")


def first_error_line(exc: BaseException, log_file: Path | None = None) -> str:
    """One line for a failed Spark job: the first executor error, with where it ran.

    Understands the text of ``Py4JJavaError`` and of PySpark's captured exceptions
    (``PythonException``, ``AnalysisException``...): a Python traceback in it gives its
    final exception line; a stage failure gives the Java exception of its most recent
    failure; anything else, its first line. Where it ran (task, stage, executor) comes
    from the stage failure or, when PySpark unwrapped the Python error from it, from the
    first lost task in the JVM's ``log_file``.
    """
    text = str(exc)
    # The Java exception behind it (Py4JJavaError.java_exception, a captured exception's
    # origin) holds the stage failure: which task, on which executor.
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    java_text = ""
    if java is not None:
        try:
            java_text = str(java.toString())
        except Exception:  # the gateway may be gone
            pass
    lines = text.splitlines()
    where = ""
    lost = _LOST.search(text) or _LOST.search(java_text)
    if lost:
        where = f" ({lost.group(1)}, {lost.group(2)})"
    elif log_file is not None and log_file.exists():
        first = _LOST_IN_LOG.search(log_file.read_text(errors="replace"))
        if first:
            where = f" ({first.group(1)}, {first.group(2)})"
    found = _python_error(lines) or _python_error(java_text.splitlines())
    if found is None and lost:
        found = _short_type(lost.group(3).strip())
    if found is None:
        candidates = [
            line.strip()
            for line in lines
            if line.strip() and not _JVM_FRAME.match(line) and not line.startswith(_NOISE)
        ]
        # py4j's own first line ("An error occurred while calling o42.collect.") says
        # nothing; the exception follows it after ": ".
        meaningful = [c for c in candidates if not c.startswith("An error occurred while")]
        found = (meaningful or candidates or [type(exc).__name__])[0].lstrip(": ")
        found = _short_type(found)
    for noise in _NOISE:
        found = found.split(noise)[0]
    return f"{found.strip()}{where}"
