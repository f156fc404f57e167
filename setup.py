"""Ship the repository's ``schemas/`` inside the wheel as ``agents_stream/_schemas``.

The schema files stay at the repository root (the compatibility checker, the golden
journals and the docs name them there), but an installed worker reads them at run time
(``agents_stream.serde.schemas.schemas_dir``), so every build must carry them.
Metadata lives in pyproject.toml; this file only extends ``build_py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACKAGED = Path("agents_stream") / "_schemas"


class BuildWithSchemas(build_py):
    def run(self) -> None:
        super().run()
        source = ROOT / "schemas"
        if not source.is_dir():  # building from an sdist that already packaged them
            return
        target = Path(self.build_lib) / PACKAGED
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.pyc", "__pycache__"))


setup(cmdclass={"build_py": BuildWithSchemas})
