"""What a job ships to its executors so that they can import the app.

A job's tasks carry the app by reference: cloudpickle pickles an agent class, an action or
a codec as "module, name", and the executor's Python worker imports that module again. On
``local[*]`` the Python workers run beside the driver, in its working directory and
environment, so whatever the driver imported they can import. On a cluster (``spark://``,
YARN, Kubernetes) they run elsewhere: in the cluster worker's own directory, with an
interpreter that has only what its environment installed. Spark's conventions for the
difference are ``--py-files`` / ``SparkContext.addPyFile`` for the user's own modules and
``spark.archives`` with a packed environment (venv-pack, conda-pack, PEX) for installed
packages; this module applies the first one by itself and checks the second one:

- :func:`app_sources` finds the app's own code: the top-level module or package of every
  module that defines one of its agents, plus every module imported from the same source
  folder (helpers beside the app). Code an installed distribution provides, or that lives
  in the interpreter's library folders, is the environment's business and is not shipped.
- :func:`ship` adds them to the session (a module as its ``.py``, a package zipped), once
  per SparkContext, plus what the user names with ``--py-files``.
- :func:`probe_executors` runs one small task per default slot that imports agents_stream
  and the app's modules, before any task of the job starts, and turns a failure into one
  line that names the missing module and the fix (:class:`ExecutorEnvironmentError`).

On ``local`` masters the Python workers share the driver's directory and environment: only
code the driver imported from elsewhere (a folder it added to ``sys.path`` itself) is
shipped, and nothing is probed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark import SparkContext

    from ..app import App

log = logging.getLogger("agents_stream.spark.jobs")

__all__ = [
    "ExecutorEnvironmentError",
    "Source",
    "app_modules",
    "app_sources",
    "check_python_exec",
    "is_local",
    "make_importable",
    "probe_executors",
    "ship",
]

_PACKED_ENV_HINT = (
    "ship a packed environment (venv-pack -o env.tar.gz; --archives env.tar.gz#env with "
    "PYSPARK_PYTHON=./env/bin/python, docs/reference.md 'Spark on a cluster')"
)


class ExecutorEnvironmentError(ConfigurationError):
    """The executors cannot import what the job's tasks need; the message names the module
    and the fix."""


@dataclass(frozen=True)
class Source:
    """A top-level module or package of the user's, as it is shipped.

    Attributes:
        name: the top-level import name (``hist_app``, ``mypkg``).
        path: the module's ``.py`` file or the package's folder.
    """

    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.is_dir()


def is_local(master: str) -> bool:
    """Whether ``master`` runs the executors in the driver's process (``local``,
    ``local[4]``, ``local-cluster`` excluded: its executors are other processes)."""
    return master == "local" or master.startswith("local[")


def app_modules(app: App) -> list[str]:
    """The modules a job's tasks import to unpickle ``app``: those defining its agents."""
    names = {binding.agent.__module__ for binding in app.agents}
    return sorted(n for n in names if n not in ("__main__", "builtins"))


def _library_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return [Path(d).resolve() for d in dirs]


def _installed_top_levels() -> set[str]:
    return set(importlib.metadata.packages_distributions())


def _top_source(name: str) -> Source | None:
    """The file or folder the top-level module ``name`` was imported from, if it has one."""
    module = sys.modules.get(name)
    if module is None:
        return None
    file = getattr(module, "__file__", None)
    locations = list(getattr(module, "__path__", None) or [])
    if file and Path(file).name == "__init__.py":
        return Source(name, Path(file).resolve().parent)
    if file and file.endswith(".py"):
        return Source(name, Path(file).resolve())
    if len(locations) == 1 and Path(locations[0]).is_dir():  # a namespace package
        return Source(name, Path(locations[0]).resolve())
    return None  # a built-in, a C extension, or a package spread over several folders


def app_sources(modules: Iterable[str]) -> list[Source]:
    """The user's code the executors need to import ``modules`` (see the module docstring).

    Each of ``modules`` counts by its top-level name; so does every other imported
    top-level module whose source lives in the same folder as one of them (a helper module
    the app imports). A top-level name an installed distribution provides, or a source in
    the interpreter's library folders, is left to the executors' environment.
    """
    installed = _installed_top_levels()
    libraries = _library_dirs()

    def user_source(name: str) -> Source | None:
        if name in installed or name in sys.builtin_module_names:
            return None
        source = _top_source(name)
        if source is None:
            return None
        if any(source.path.is_relative_to(d) for d in libraries):
            return None
        return source

    wanted: dict[str, Source] = {}
    for name in modules:
        source = user_source(name.partition(".")[0])
        if source is not None:
            wanted[source.name] = source
    roots = {s.path.parent for s in wanted.values()}
    for name in list(sys.modules):
        if "." in name or name in wanted:
            continue
        source = user_source(name)
        if source is not None and source.path.parent in roots:
            wanted[name] = source
    return sorted(wanted.values(), key=lambda s: s.name)


def _zip_package(source: Source, into: Path) -> Path:
    """``<name>.zip`` of the package's folder (its files under ``<name>/``), named by a
    digest of its contents so that an edited package is a new file to Spark."""
    files = sorted(
        p
        for p in source.path.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not any(part.startswith(".") for part in p.relative_to(source.path).parts)
        and p.suffix not in (".pyc", ".pyo")
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(source.path)).encode())
        digest.update(path.read_bytes())
    folder = into / digest.hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{source.name}.zip"
    if not target.exists():
        partial = folder / f".{source.name}.zip.partial"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, Path(source.name) / path.relative_to(source.path))
        partial.rename(target)
    return target


def ship(sc: SparkContext, sources: Sequence[Source], py_files: Sequence[str] = ()) -> list[str]:
    """Adds ``sources`` and ``py_files`` to ``sc`` (``addPyFile``), each name once per
    context; returns the paths added now.

    Spark refuses a second file of the same name from another path, and executors keep the
    copy they fetched first: a module edited after it was shipped in this context is
    shipped again only by a new session (a warning says so).
    """
    shipped: dict[str, str] | None = getattr(sc, "_agents_stream_shipped", None)
    if shipped is None:
        # What spark-submit's --py-files shipped already (Spark refuses a second copy).
        shipped = {os.path.basename(p): p for p in configured_py_files(sc.getConf())}
    added: list[str] = []
    staging = Path(tempfile.gettempdir()) / "agents-stream-spark-ship"
    paths = [str(_zip_package(s, staging)) if s.is_package else str(s.path) for s in sources] + [
        str(Path(p).resolve()) if "://" not in p else p for p in py_files
    ]
    for path in paths:
        name = os.path.basename(path)
        if name in shipped:
            if shipped[name] != path:
                log.warning(
                    "spark: %s was shipped to the executors earlier in this session from %s; "
                    "they keep that copy (start a new session to ship %s)",
                    name,
                    shipped[name],
                    path,
                )
            continue
        sc.addPyFile(path)
        shipped[name] = path
        added.append(path)
    sc._agents_stream_shipped = shipped  # type: ignore[attr-defined]
    return added


def _import_all(names: Sequence[str]) -> list[tuple[str, str]]:
    """Runs on an executor: (module, "Type: message") for each of ``names`` it cannot
    import (a top-level function, so the probe pickles by reference)."""
    import importlib

    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # every failure is reported, as a line
            failed.append((name, f"{type(exc).__name__}: {exc}"))
    return failed


def probe_executors(sc: SparkContext, modules: Sequence[str], shipped: Sequence[str]) -> None:
    """Imports agents_stream and ``modules`` in the executors' Python workers, before the
    job's first task.

    Raises:
        ExecutorEnvironmentError: an executor cannot start Python or import one of them;
            the message names the module, the error and the fix.
    """
    from .failures import first_error_line

    names = ["agents_stream", "agents_stream.spark.jobs.backfill_task", *modules]
    slots = max(1, min(int(sc.defaultParallelism), 64))
    try:
        failures = (
            sc.parallelize(range(slots), slots)
            .map(lambda _: _import_all(names))
            .flatMap(lambda found: found)
            .distinct()
            .collect()
        )
    except Exception as exc:  # a Py4J / captured error: its first line
        line = first_error_line(exc)
        fix = (
            _PACKED_ENV_HINT
            if "agents_stream" in line or "Python" in line
            else ("pass the module with --py-files")
        )
        raise ExecutorEnvironmentError(
            f"the executors cannot run the job's Python: {line}; {fix}"
        ) from exc
    if not failures:
        return
    module, error = sorted(failures)[0]
    if module.startswith("agents_stream") or not any(m.split(".")[0] in error for m in modules):
        fix = _PACKED_ENV_HINT
    else:
        fix = "pass it with --py-files (a .py, .zip or .egg) or install it on the executors"
    what = ", ".join(shipped) if shipped else "nothing"
    raise ExecutorEnvironmentError(
        f"the executors cannot import {module!r}: {error} (shipped {what}); {fix}"
    )


def check_python_exec(sc: SparkContext) -> None:
    """Refuses an executors' interpreter path the driver cannot start.

    Spark plans a read of a Python data source (``agents_stream.kafka``) in a Python
    process on the driver, started with the executors' interpreter path
    (``PYSPARK_PYTHON`` / ``spark.pyspark.python``). A path relative to a packed
    environment (``./env/bin/python`` with ``--archives env.tar.gz#env``) must therefore
    also resolve from the driver's directory: run the job from the folder holding the
    venv that was packed, under the archive's alias.

    Raises:
        ExecutorEnvironmentError: the path is relative and names no file here.
    """
    python = str(getattr(sc, "pythonExec", "") or "")
    if not python or os.path.isabs(python) or os.sep not in python or Path(python).exists():
        return
    raise ExecutorEnvironmentError(
        f"PYSPARK_PYTHON={python} does not exist in {Path.cwd()}: Spark starts the job's "
        "Kafka reads in a Python process on the driver with the executors' interpreter "
        "path, so run from the folder that holds the packed venv under the archive's "
        f"alias (./{_alias(python)}/ for --archives env.tar.gz#{_alias(python)}), or give "
        "an absolute path every host has"
    )


def _alias(python: str) -> str:
    """``./env/bin/python`` -> ``env``: the folder an archive alias unpacks to."""
    parts = [p for p in Path(python).parts if p != "."]
    return parts[0] if parts else python


def make_importable(
    sc: SparkContext, app: App, *, py_files: Sequence[str] = (), probe: bool = True
) -> list[str]:
    """Ships the app's code to a cluster's executors and checks they can import it.

    The step every job takes before its first task (:func:`app_sources`, :func:`ship`,
    :func:`probe_executors`); on a ``local`` master see the module docstring.

    Returns:
        The paths shipped now.
    """
    check_python_exec(sc)
    master = str(sc.master)
    modules = app_modules(app)
    sources = app_sources(modules)
    local = is_local(master)
    if local:
        # Local Python workers start in the driver's directory with its PYTHONPATH: only
        # code the driver found elsewhere (a sys.path entry added at run time) is shipped.
        reachable = {Path.cwd().resolve(), *_pythonpath()}
        sources = [s for s in sources if s.path.parent not in reachable]
    added = ship(sc, sources, py_files)
    for path in added:
        log.info("spark: shipping %s to the executors", path)
    probed: set[str] = getattr(sc, "_agents_stream_probed", set())
    if probe and not local and (added or not set(modules) <= probed):
        probe_executors(sc, modules, [os.path.basename(p) for p in added])
        sc._agents_stream_probed = probed | set(modules)  # type: ignore[attr-defined]
    return added


def _pythonpath() -> set[Path]:
    return {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}


def configured_py_files(conf: Any) -> list[str]:
    """``spark.submit.pyFiles`` of a SparkConf (what spark-submit's --py-files set)."""
    value = conf.get("spark.submit.pyFiles", "") or ""
    return [p for p in value.split(",") if p]
