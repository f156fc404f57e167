"""What a Spark job ships to a cluster's executors (agents_stream.spark.shipping), and how a
failed job becomes one line (agents_stream.spark.failures): no JVM here, a recording
stand-in for the SparkContext and the exception texts Spark really produces."""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path

import pytest

from agents_stream.spark.errors import TaskRecordError
from agents_stream.spark.failures import first_error_line, job_log_path, log4j_config
from agents_stream.spark.shipping import (
    Source,
    app_modules,
    app_sources,
    is_local,
    make_importable,
    ship,
)

APP = """
from agents_stream import Agent, App, InputEvent, RunnerContext, action
from {helper} import label

class Shipped(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event: InputEvent, ctx: RunnerContext) -> None:
        label(event.input)

app = App("shipped")
app.agent(Shipped, input="in", output="out")
"""


class Context:
    """The SparkContext surface the shipping uses: master, conf, addPyFile."""

    def __init__(self, master: str, py_files: str = "") -> None:
        self.master = master
        self.added: list[str] = []
        self.conf = {"spark.submit.pyFiles": py_files}

    def getConf(self):  # Spark's name
        return self.conf

    def addPyFile(self, path: str) -> None:  # Spark's name
        self.added.append(path)


@pytest.fixture
def app_dir(tmp_path, monkeypatch):
    """A folder only this test imports from: an app module, its helper, and a package."""
    root = tmp_path / "driver"
    root.mkdir()
    token = tmp_path.name.replace("-", "_")
    helper = f"helper_{token}"
    (root / f"{helper}.py").write_text("def label(value):\n    return str(value)\n")
    (root / f"app_{token}.py").write_text(APP.format(helper=helper))
    pkg = root / f"pkg_{token}"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "agents.py").write_text(APP.format(helper=helper))
    (pkg / "data.json").write_text("{}")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.pyc").write_bytes(b"\0")
    monkeypatch.syspath_prepend(str(root))
    yield root, token
    for name in [n for n in sys.modules if token in n]:
        del sys.modules[name]


def test_a_module_and_the_helper_beside_it_are_shipped(app_dir):
    root, token = app_dir
    module = importlib.import_module(f"app_{token}")
    assert app_modules(module.app) == [f"app_{token}"]
    sources = app_sources(app_modules(module.app))
    assert [(s.name, s.path) for s in sources] == [
        (f"app_{token}", (root / f"app_{token}.py").resolve()),
        (f"helper_{token}", (root / f"helper_{token}.py").resolve()),
    ]


def test_a_package_is_zipped_whole_without_caches(app_dir, tmp_path):
    _, token = app_dir
    module = importlib.import_module(f"pkg_{token}.sub.agents")
    sources = app_sources(app_modules(module.app))
    package = next(s for s in sources if s.name == f"pkg_{token}")
    assert package.is_package
    sc = Context("spark://127.0.0.1:7077")
    added = ship(sc, sources)
    archive = next(Path(p) for p in added if p.endswith(".zip"))
    assert archive.name == f"pkg_{token}.zip"
    names = set(zipfile.ZipFile(archive).namelist())
    assert f"pkg_{token}/sub/agents.py" in names and f"pkg_{token}/data.json" in names
    assert not any("__pycache__" in n for n in names)


def test_installed_and_library_code_is_left_to_the_environment():
    import json  # the standard library

    import agents_stream  # an installed distribution (editable here)

    assert json and agents_stream
    assert app_sources(["json", "agents_stream.app", "confluent_kafka"]) == []


def test_each_name_ships_once_per_context_and_submitted_files_are_not_repeated(app_dir):
    root, token = app_dir
    module = importlib.import_module(f"app_{token}")
    sources = app_sources(app_modules(module.app))
    sc = Context("spark://h:7077", py_files=f"file:{root}/helper_{token}.py")
    assert ship(sc, sources) == [str((root / f"app_{token}.py").resolve())]
    assert ship(sc, sources) == []  # the same context: already there
    assert sc.added == [str((root / f"app_{token}.py").resolve())]


def test_local_masters_ship_only_what_their_workers_cannot_reach(app_dir, monkeypatch):
    root, token = app_dir
    module = importlib.import_module(f"app_{token}")
    sc = Context("local[2]")
    # The folder is on the driver's sys.path only: a local Python worker would not see it.
    added = make_importable(sc, module.app)
    assert sorted(Path(p).name for p in added) == [f"app_{token}.py", f"helper_{token}.py"]
    monkeypatch.chdir(root)  # from the driver's directory, local workers import it
    again = Context("local[*]")
    assert make_importable(again, module.app) == []


def test_masters():
    assert is_local("local") and is_local("local[*]") and is_local("local[4]")
    assert not is_local("local-cluster[2,1,1024]")
    assert not is_local("spark://h:7077") and not is_local("yarn")


def test_source_kind(tmp_path):
    assert not Source("m", tmp_path / "m.py").is_package
    assert Source("p", tmp_path).is_package


# -- one line for a failed job -------------------------------------------------------------

PYTHON_WORKER = """\
An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/x/pyspark.zip/pyspark/worker.py", line 4197, in invoke_udf
    func, profiler, deserializer, serializer = read_command(pickleSer, init_info.udf_info)
                                               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/x/pyspark.zip/pyspark/serializers.py", line 483, in loads
    return cloudpickle.loads(obj, encoding=encoding)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'hist_app'
"""

STAGE_FAILURE = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in stage 7.0 "
    "failed 4 times, most recent failure: Lost task 3.3 in stage 7.0 (TID 9) (127.0.0.1 "
    "executor 0): org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An "
    "exception was thrown from the Python worker: Traceback (most recent call last):\n"
    '  File "/x/worker.py", line 1, in main\n'
    "ModuleNotFoundError: No module named 'hist_app'\n SQLSTATE: 38000\n"
    "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)\n"
)


class Java:
    def __init__(self, text: str) -> None:
        self.text = text

    def toString(self) -> str:  # Py4J's name
        return self.text


class Captured(Exception):
    """PySpark's captured exception: the Python text, the Java origin behind it."""

    def __init__(self, text: str, origin: str) -> None:
        super().__init__(text)
        self._origin = Java(origin)


def test_a_python_worker_error_is_its_last_line_with_the_task_that_ran_it():
    line = first_error_line(Captured(PYTHON_WORKER, STAGE_FAILURE))
    assert line == (
        "ModuleNotFoundError: No module named 'hist_app' "
        "(task 3.3 in stage 7.0, 127.0.0.1 executor 0)"
    )


def test_a_record_error_names_the_record():
    cause = TaskRecordError(
        ValueError("bad journal record"), topic="t-action-state", partition=1, offset=42
    )
    text = PYTHON_WORKER.replace(
        "ModuleNotFoundError: No module named 'hist_app'",
        f"agents_stream.spark.errors.TaskRecordError: {cause}",
    )
    assert first_error_line(Captured(text, "")) == (
        "TaskRecordError: ValueError: bad journal record (topic t-action-state, partition 1, "
        "offset 42)"
    )


def test_a_java_only_failure_and_a_py4j_error():
    java = STAGE_FAILURE.split("org.apache.spark.api.python.PythonException")[0] + (
        "java.lang.OutOfMemoryError: Java heap space\n\tat x.y(z.java:1)\n"
    )
    assert first_error_line(Captured("", java)) == (
        "OutOfMemoryError: Java heap space (task 3.3 in stage 7.0, 127.0.0.1 executor 0)"
    )

    class Py4JJavaError(Exception):
        java_exception = Java("java.io.IOException: Connection refused")

        def __str__(self) -> str:
            return "An error occurred while calling o42.collect.\n: java.io.IOException: x"

    assert first_error_line(Py4JJavaError()) == "IOException: x"


def test_an_analysis_error_is_its_first_line():
    text = "[PATH_NOT_FOUND] Path does not exist: file:/nope. SQLSTATE: 42K03\nJVM stacktrace:\n"
    assert (
        first_error_line(Captured(text, "")) == "[PATH_NOT_FOUND] Path does not exist: file:/nope."
    )


def test_the_job_log_and_its_log4j_configuration(tmp_path):
    path = job_log_path("backfill", "my app/1", tmp_path)
    assert path.parent == tmp_path and path.name.startswith("spark-backfill-my_app_1-")
    config = log4j_config(path).read_text()
    assert f"appender.file.fileName = {path}" in config
    assert "rootLogger.appenderRef.console.level = warn" in config


def test_where_it_ran_comes_from_the_jvm_log_when_pyspark_unwrapped_it(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(
        "26/12/01 WARN org.apache.spark.scheduler.TaskSetManager: Lost task 3.0 in stage 9.0 "
        "(TID 12) (127.0.0.1 executor 0): org.apache.spark.api.python.PythonException: ...\n"
    )
    line = first_error_line(Captured(PYTHON_WORKER, "PythonException: ..."), log)
    assert line.endswith("(task 3.0 in stage 9.0, 127.0.0.1 executor 0)")
