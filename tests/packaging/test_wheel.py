"""The wheel a user gets from ``make wheel`` runs outside the repository, with the core
dependencies only.

Built once from a copy of the sources (the repo stays untouched) the way ``pip install .``
builds it (isolated build environment from the configured index), then installed with its
dependencies, as a user installs it, into a fresh venv outside the repo: nothing from this
venv (pytest, PySpark, Faust) is reachable from it, so a dependency the quick start needs
but ``[project] dependencies`` lacks fails here. The README's quick start then runs with
that venv's commands.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.test_readme import _quick_start, run_quick_start

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("agents_stream", "schemas", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
# What the quick start must not pull in: the extras of `make test`, `make bench`.
NOT_CORE = ("pyspark", "faust-streaming", "pytest", "ruff", "mypy", "hypothesis", "quixstreams")

pytestmark = pytest.mark.timeout(300)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    # The metadata is on setuptools' current conventions (SPDX license string): no
    # deprecation boxes in what pip prints.
    assert "deprecated" not in (proc.stdout + proc.stderr).lower(), proc.stderr
    return proc.stdout


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv outside the repo with the built wheel and its core dependencies."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    dist = base / "dist"
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), "."], src)
    (wheel,) = dist.glob("agents_stream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "agents_stream/_schemas/ActionState/v1.avsc" in names
    assert "agents_stream/_schemas/compatibility.json" in names

    venv = base / "venv"
    began = time.monotonic()
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    python = venv / "bin" / "python"
    # This pip installs into that venv (--python): the venv itself carries no pip.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([*pip, "--python", str(python), "install", "-q", str(wheel)], base, env)
    took = time.monotonic() - began
    listed = _run([*pip, "--python", str(python), "list", "--format=freeze"], base, env)
    present = {line.split("==")[0].lower() for line in listed.split()}
    assert not present & set(NOT_CORE), present & set(NOT_CORE)
    # Figures for README's "about 150 MB in 15 s" (warm pip cache), shown with -s / -rA.
    print(f"\ncore install: {_size_mb(venv):.0f} MB, {len(present)} packages, {took:.1f}s")
    return venv


def test_installed_worker_help(installed: Path, tmp_path: Path) -> None:
    out = _run([str(installed / "bin" / "agents-stream"), "worker", "--help"], tmp_path)
    assert "--broker" in out and "embedded" in out


def test_installed_package_reads_its_schemas(installed: Path, tmp_path: Path) -> None:
    code = (
        "import agents_stream, sys\n"
        "from agents_stream.serde.schemas import schemas_dir, load_versions\n"
        "from agents_stream.serde.journal import default_journal_codec\n"
        "print(agents_stream.__file__)\n"
        "print(schemas_dir())\n"
        "print(len(load_versions('ActionState')))\n"
        "default_journal_codec(None, 't-action-state')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = _run([str(installed / "bin" / "python"), "-c", code], tmp_path, env).split("\n")
    package, folder, versions = out[0], out[1], int(out[2])
    assert package.startswith(str(installed)), package
    assert folder.startswith(str(installed)) and folder.endswith("_schemas"), folder
    assert versions >= 1


@pytest.mark.broker
def test_quick_start_runs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    """README's quick start with the wheel's venv first on PATH: its `agents-stream`
    runs the broker, the worker, produce and tail, from the core install alone."""
    result = run_quick_start(_quick_start(tmp_path), installed / "bin", isolated=True)
    assert str(ROOT) not in result.stderr  # no traceback or path from the checkout
