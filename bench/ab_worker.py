"""A/B of the worker between two commits: interleaved drains, same machine, same minute.

``bench_e2e.py`` moves +-25 % between two runs of the same code on this shared machine,
more than most changes are worth. This script measures a change instead: it checks out
``--base`` (default ``HEAD~1``) in a temporary git worktree and drains the same backlog
with a worker of that code and of the working tree, alternating, ``--rounds`` times,
then prints the means side by side.

Each drain is one subprocess: an embedded broker, ``--records`` JSON records (1,000
keys, 4 partitions), the bench app of ``bench/e2e/as_app.py`` (``--calls`` journaled
calls per record, ``--kind`` sync or async action) in an in-process ``Worker``, and a
reader of the output topic in a separate process. Rate = outputs / span of their
timestamps; CPU = the worker process's CPU time per record (every thread).

Run: ``.venv/bin/python bench/ab_worker.py [--base REV] [--records 20000]
[--calls 0,1] [--kind sync] [--rounds 3]``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import parser, table

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def drain(root: Path, records: int, calls: int, kind: str) -> dict[str, float]:
    """One drain with the agents_stream of ``root``; its figures."""
    env = dict(os.environ, AB_ROOT=str(root))
    out = subprocess.run(
        [sys.executable, str(HERE / "e2e" / "drain.py"), str(records), str(calls), kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    raise RuntimeError(f"drain with {root} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--base", default="HEAD~1", help="the commit to compare against")
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--calls", default="0,1", help="journaled calls per record, comma-separated")
    p.add_argument("--kind", choices=["sync", "async", "async_inline"], default="sync")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), rev],
            capture_output=True,
            check=True,
        )
        try:
            for calls in [int(c) for c in args.calls.split(",")]:
                runs: dict[str, list[dict[str, float]]] = {"base": [], "tree": []}
                for n in range(args.rounds):
                    for side, root in (("base", base), ("tree", REPO)):
                        runs[side].append(drain(root, args.records, calls, args.kind))
                        print(f"  {calls} calls, round {n + 1}, {side}: {runs[side][-1]}")
                mean = {
                    side: {k: sum(r[k] for r in rs) / len(rs) for k in ("rate", "cpu_us")}
                    for side, rs in runs.items()
                }
                rows.append(
                    [
                        f"{args.kind}, {calls} calls",
                        mean["base"]["rate"],
                        mean["tree"]["rate"],
                        mean["tree"]["rate"] / mean["base"]["rate"],
                        mean["base"]["cpu_us"],
                        mean["tree"]["cpu_us"],
                    ]
                )
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                capture_output=True,
                check=False,
            )
    print(f"\n{args.records:,} records, means of {args.rounds} interleaved rounds; base {rev}")
    header = ["variant", "base ev/s", "tree ev/s", "tree/base", "base cpu us", "tree cpu us"]
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
