"""`make bench`'s scripts still fit together and fit the library.

No test runs the benches (minutes, peers from the ``bench`` extra), yet they share
helpers (``bench_e2e.collect``, ``common``) and call the library's internals: a changed
return value of ``collect`` once broke ``bench_slow_calls`` unnoticed until the next
``make bench``. mypy, not strict, over the scripts finds such mismatches in seconds.
The peers' own script (``e2e/systems.py``) is left out, and other packages count as
untyped: their types are not this repository's to keep.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def test_bench_scripts_type_check(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    config = tmp_path / "mypy.ini"
    # Only the scripts and the library are checked: other packages are taken as untyped
    # (Any), or a new release's stubs (confluent-kafka's, say) would fail this test on a
    # fresh install with nothing in the repository changed.
    config.write_text(
        "[mypy]\npython_version = 3.11\nignore_missing_imports = True\nfollow_imports = skip\n"
        "\n[mypy-agents_stream.*]\nfollow_imports = silent\n"
    )
    # Named as modules, the library from this checkout (mypy cannot see an editable
    # install), the e2e scripts as the package modules the drain imports the app as.
    modules = [p.stem for p in sorted(BENCH.glob("*.py"))] + ["bench.e2e.drain", "bench.e2e.as_app"]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", str(config)]
        + [arg for module in modules for arg in ("-m", module)],
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": os.pathsep.join([str(BENCH), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
