"""The wheel a user gets from ``pip install .`` runs outside the repository.

Built from a copy of the sources (the repo stays untouched) the way ``pip install .``
builds it (isolated build environment from the configured index), then installed with
``--no-deps`` into a fresh venv outside the repo whose dependencies come from this venv's
site-packages through a ``.pth`` line, so no network is needed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("agents_stream", "schemas", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")

pytestmark = pytest.mark.timeout(240)


def _run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv outside the repo with only the built wheel of agents_stream installed."""
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
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    python = venv / "bin" / "python"
    _run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        base,
    )
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base
        ).strip()
    )
    # Dependencies only; the repo's own (editable) agents_stream is not reachable from it.
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
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
    out = _run([str(installed / "bin" / "python"), "-c", code], tmp_path).split("\n")
    package, folder, versions = out[0], out[1], int(out[2])
    assert package.startswith(str(installed)), package
    assert folder.startswith(str(installed)) and folder.endswith("_schemas"), folder
    assert versions >= 1
