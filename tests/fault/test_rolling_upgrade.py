"""A rolling upgrade across the journal format change of two-phase obligations (ActionState
v8), on Apache Kafka, with the previous release itself.

The release before v8 (:data:`PREVIOUS_RELEASE`, main before the journal v8 work, which
writes v7: completion groups) is
installed from this repository's git history into a temporary directory and runs a
worker (its ``agents_stream`` shadows today's on ``PYTHONPATH``; the app module is
today's tests/apps/crashy.py, whose API both releases share). It completes records (one
with memory), then is SIGKILLed with a reconcilable call's PENDING slot acknowledged (the
charge made, its result not journaled) after the same record's first two calls were
journaled and acknowledged.
Today's worker takes the partitions over: the journaled calls are replayed, the PENDING
call reconciled (not charged again), the key's memory carried on, every record's output
exactly once, every side effect once (counted in SQLite where each call starts). Then a
worker of the previous release is started against the journal v8 wrote: it refuses it
(the unknown schema fingerprint: v7 workers cannot read v8 records) and exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agents_stream.testing.process import WorkerProcess
from agents_stream.testing.topics import read_topic
from tests.fault.fleet import critical_lines
from tests.fault.scenario import CrashScenario, wait_log

pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.kafka_only]

APP = "tests.apps.crashy:app"
ROOT = Path(__file__).resolve().parents[2]


# The last commit of main before journal v8 (two-phase obligations): its tree knows
# ActionState v1..v7 (completion groups). The v6 -> v7 upgrade was proven the same way
# from 4c214235df6fdcb7a61e32ea3ba9e80c753fb913 (bench/HISTORY.md, issue 64).
PREVIOUS_RELEASE = "e86db990df11209acf4c435d7ce2c48281640655"


def previous_release() -> str:
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    if known.returncode != 0:
        pytest.skip(f"commit {PREVIOUS_RELEASE[:7]} is not in this clone's history")
    return PREVIOUS_RELEASE


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release, pip-installed from git (no dependencies: the test venv's)."""
    target = tmp_path_factory.mktemp("previous-release")
    commit = subprocess.check_output(
        ["git", "rev-parse", previous_release()], cwd=ROOT, text=True
    ).strip()
    # Built in isolation: the release's build backend (setuptools>=77) from the index.
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
            "--target", str(target), f"git+file://{ROOT}@{commit}",
        ],
        check=True, timeout=300,
    )  # fmt: skip
    schemas = target / "agents_stream" / "_schemas" / "ActionState"
    assert (schemas / "v7.avsc").exists() and not (schemas / "v8.avsc").exists()
    return target


def test_previous_release_killed_mid_record_then_this_one_takes_over(
    broker, topic_factory, worker_factory, tmp_path, old_release
):
    crash = CrashScenario(broker, topic_factory, tmp_path, lambda env: worker_factory(APP, env))
    run_dir = tmp_path / "old-cwd"  # not the repo: its agents_stream would come first
    run_dir.mkdir()

    def old_worker(name: str) -> WorkerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTS_STREAM_SCHEMAS")}
        env.update(crash.env)
        env["PYTHONPATH"] = os.pathsep.join([str(old_release), str(ROOT)])
        return WorkerProcess(
            APP,
            broker=broker.url,
            data_dir=tmp_path / f"data-{name}",
            log_file=tmp_path / f"{name}.log",
            env=env,
            cwd=run_dir,
            extra_args=["--worker-id", name],
        ).start()

    old = old_worker("old")
    try:
        wait_log(old, "assigned", timeout=90)
        assert str(old_release) in _imported_from(old_release, run_dir, crash.env)
        crash.send({"scenario": "two-actions", "n": 3}, {"scenario": "calls", "n": 4})
        crash.outputs(2)
        crash.arm("in-charge")
        crash.send({"scenario": "charge-after-calls", "n": 1})
        # Two calls journaled and acked, then the charge's PENDING acked and the charge
        # made, its result not journaled.
        crash.wait_parked("in-charge", old)
        old.kill()
    finally:
        old.kill()
    crash.disarm("in-charge")

    new = crash.start()
    wait_log(new, "assigned", timeout=90)
    crash.send({"scenario": "two-actions", "n": 3}, {"scenario": "calls", "n": 5})
    outputs = crash.outputs(5)
    by_n = Counter(o["n"] for o in outputs)
    assert by_n == {1: 1, 3: 2, 4: 1, 5: 1}, outputs
    counts = sorted(o["count"] for o in outputs if o["n"] == 3)
    assert counts == [1, 2]  # the key's memory carried over the upgrade
    [killed] = [o for o in outputs if o["n"] == 1]
    assert killed["results"] == ["fetch-1", "score-1"]  # replayed from v7 records
    assert killed["charge"] == {"charged": 1, "by": "reconciler"}  # not charged again
    assert crash.effects() == {
        "fetch": 3, "score": 3, "notify": 2,  # n = 4, 1, 5 (n=1: no notify)
        "charge": 1, "reconcile": 1,
        "first": 2, "second": 2,
    }  # fmt: skip
    assert new.alive and not critical_lines(new), new.log()
    # The new worker wrote v8-framed records.
    assert new.terminate() == 0
    assert "calls_replayed=2" in new.log(), new.log()

    # A worker of the previous release against a journal v8 wrote: refused, it exits.
    again = old_worker("old-again")
    deadline = time.monotonic() + 90
    while again.alive and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not again.alive, again.log()
    assert "unknown schema fingerprint" in again.log(), again.log()
    assert len(read_topic(broker.bootstrap, crash.env["AS_OUTPUT"])) == 5  # nothing more


def _imported_from(release: Path, cwd: Path, env: dict[str, str]) -> str:
    """Where ``agents_stream`` comes from for a process started as the old worker is."""
    return subprocess.run(
        [sys.executable, "-c", "import agents_stream; print(agents_stream.__file__)"],
        cwd=cwd,
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(release), str(ROOT)])},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
