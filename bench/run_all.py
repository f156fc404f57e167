"""Run every ``bench/bench_*.py`` and print each one's table under a heading (``make bench``).

Each bench runs in its own subprocess (a fresh interpreter and, where it needs one, its
own embedded broker or SparkSession), so one failing or hanging does not take the others
down: a failure is reported, its stderr tail printed, and the run goes on. The exit status
is 1 if any bench failed.

Order: pure-CPU benches first (seconds), then those on an embedded broker, Spark last
(JVM start-up dominates). Quick mode (the default here) sets
``AGENTS_STREAM_BENCH_QUICK=1``, which benches that support it read to keep sizes moderate
so the whole run stays around five minutes; ``--full`` runs the default sizes.

    .venv/bin/python bench/run_all.py [--full] [--only journal,rebuild] [--timeout 400]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUICK_ENV = "AGENTS_STREAM_BENCH_QUICK"  # mirrors bench/common.py, which needs the package
ORDER = [
    "bench_serde",
    "bench_aio",
    "bench_e2e",
    "bench_slow_calls",
    "bench_journal",
    "bench_latency",
    "bench_rebuild",
    "bench_spark_source",
]


def discover(only: list[str] | None) -> list[Path]:
    """The bench scripts, known ones in ORDER, unknown ones by name, Spark ones last."""

    def rank(path: Path) -> tuple[bool, int, str]:
        name = path.stem
        known = ORDER.index(name) if name in ORDER else len(ORDER)
        return ("spark" in name, known, name)

    scripts = sorted(HERE.glob("bench_*.py"), key=rank)
    if only:
        scripts = [s for s in scripts if any(o in s.stem for o in only)]
    return scripts


def run(script: Path, *, quick: bool, timeout: float) -> tuple[str, float]:
    """Run one bench with its stdout streamed through; returns (status, seconds)."""
    env = {**os.environ, QUICK_ENV: "1" if quick else "0"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark workers use this venv too
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=ROOT,
            env=env,
            stdout=None,  # the table goes straight to our stdout, in order
            stderr=subprocess.PIPE,  # library and JVM chatter: shown only on failure
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        _tail(exc.stderr)
        return f"TIMEOUT after {timeout:.0f} s", time.perf_counter() - started
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        _tail(proc.stderr)
        return f"FAILED (exit {proc.returncode})", seconds
    return "ok", seconds


def _tail(stderr: bytes | str | None, lines: int = 25) -> None:
    if not stderr:
        return
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    print("\n[stderr, last lines]", *text.rstrip().splitlines()[-lines:], sep="\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="default (larger) sizes, not quick")
    p.add_argument("--only", default="", help="comma-separated substrings of bench names")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds per bench")
    args = p.parse_args(argv)
    only = [o.strip() for o in args.only.split(",") if o.strip()] or None
    scripts = discover(only)
    quick = not args.full
    started = time.perf_counter()
    summary: list[tuple[str, str, float]] = []
    for script in scripts:
        heading = f"== {script.stem} " + ("(quick) " if quick else "")
        print(f"\n{heading:=<78}", flush=True)
        status, seconds = run(script, quick=quick, timeout=args.timeout)
        summary.append((script.stem, status, seconds))

    total = time.perf_counter() - started
    print(f"\n{'== summary ':=<78}")
    width = max((len(name) for name, _, _ in summary), default=5)
    for name, status, seconds in summary:
        print(f"{name:<{width}}  {seconds:>7.1f} s  {status}")
    print(f"{'total':<{width}}  {total:>7.1f} s")
    return 0 if all(status == "ok" for _, status, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
