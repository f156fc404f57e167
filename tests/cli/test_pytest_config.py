"""Running the suite without pytest-timeout (issue 67, item 10): pyproject's ``timeout``
is declared by tests/conftest.py then, and pytest no longer warns "Unknown config
option: timeout"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_unknown_option_warning_without_pytest_timeout():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:timeout", "-p", "no:cacheprovider",
         "-W", "error::pytest.PytestConfigWarning", "tests/cli/test_dlq_cli.py"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Unknown config option" not in done.stdout + done.stderr
