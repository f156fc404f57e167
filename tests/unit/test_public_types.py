"""The package type-checks strictly (mypy --strict over agents_stream), and
ctx.execute returns fn's type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_strict_over_the_package():
    pytest.importorskip("mypy")
    # Files and strictness come from [tool.mypy] in pyproject.toml (what `make lint` runs).
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
