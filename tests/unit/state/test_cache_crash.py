"""The cache writes nothing to RocksDB's write-ahead log: a process killed with entries
still in memory must reopen a consistent prefix, the entries of exactly the batches up to
the checkpoint it reopens with (the next rebuild replays the topic from there). Checked
on real RocksDB in a child process that SIGKILLs itself at a random point, against a
dict replaying the same batches."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream.state.cache import CHECKPOINT_KEY, FLUSH_EVERY_S, LEGACY_KEY, PartitionCache

KEYS = [f"a\x1fk{i}\x1f{i}\x1forders\x1fA.f#0".encode() for i in range(12)]


def batches(seed: int, count: int) -> list[list[tuple[bytes, bytes | None]]]:
    rng = random.Random(seed)
    out = []
    for n in range(count):
        batch: list[tuple[bytes, bytes | None]] = []
        for _ in range(rng.randint(1, 6)):
            key = rng.choice(KEYS)
            batch.append((key, None if rng.random() < 0.3 else f"v{n}".encode() * 40))
        out.append(batch)
    return out


def model(applied: list[list[tuple[bytes, bytes | None]]]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for batch in applied:
        for key, value in batch:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    sys.path.insert(0, sys.argv[4])
    from tests.unit.state.test_cache_crash import batches
    from agents_stream.state.cache import FLUSH_EVERY_S, PartitionCache
    path, seed, plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    cache = PartitionCache(__import__("pathlib").Path(path))
    for n, batch in enumerate(batches(seed, plan["count"])):
        cache.apply(batch, n + 1)
        if n + 1 in plan["flush"]:  # as the store's flusher does once writes are due
            cache.flush_if_due(time.monotonic() + FLUSH_EVERY_S + 1)
        if n + 1 in plan["wait"]:
            cache.db.flush(wait=True)
        if n + 1 == plan["kill"]:
            os.kill(os.getpid(), signal.SIGKILL)
    """
)


def run_and_kill(path: Path, seed: int, plan: dict) -> None:
    root = str(Path(__file__).resolve().parents[3])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(seed), json.dumps(plan), root],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(1, 60),
    data=st.data(),
)
def test_a_killed_process_reopens_a_prefix_of_its_batches(
    tmp_path_factory, seed: int, count: int, data: st.DataObject
) -> None:
    path = tmp_path_factory.mktemp("cache") / "p0"
    kill = data.draw(st.integers(1, count))
    steps = st.lists(st.integers(1, kill), max_size=4)
    plan = {"count": count, "kill": kill, "flush": data.draw(steps), "wait": data.draw(steps)}
    run_and_kill(path, seed, plan)

    cache = PartitionCache(path)
    try:
        checkpoint = cache.checkpoint
        assert checkpoint >= max(plan["wait"], default=0)  # a finished flush persisted
        assert checkpoint <= kill
        found = {k: v for k, v in cache.db.items() if k not in (CHECKPOINT_KEY, LEGACY_KEY)}
        assert found == model(batches(seed, count)[:checkpoint])
    finally:
        cache.close()


def test_live_writes_are_flushed_once_due_and_on_close(tmp_path: Path) -> None:
    cache = PartitionCache(tmp_path / "p0")
    now = time.monotonic()
    assert not cache.flush_if_due(now + FLUSH_EVERY_S + 1)  # nothing written yet
    cache.apply([(KEYS[0], b"x")], 1)
    assert not cache.flush_if_due(now)  # written just now: not due
    assert cache.flush_if_due(time.monotonic() + FLUSH_EVERY_S + 1)
    assert not cache.flush_if_due(time.monotonic() + FLUSH_EVERY_S + 1)  # nothing since
    cache.apply([(KEYS[1], b"y")], 2)
    cache.close()
    reopened = PartitionCache(tmp_path / "p0")
    try:
        assert reopened.checkpoint == 2 and reopened.db.get(KEYS[1]) == b"y"
    finally:
        reopened.close()


def test_a_kill_loses_unflushed_writes_but_keeps_their_checkpoint_with_them(
    tmp_path: Path,
) -> None:
    """The case the property covers, spelled out: flushed at batch 3, killed at 5."""
    path = tmp_path / "p0"
    run_and_kill(path, 7, {"count": 5, "kill": 5, "flush": [], "wait": [3]})
    cache = PartitionCache(path)
    try:
        assert cache.checkpoint == 3
        found = {k: v for k, v in cache.db.items() if k not in (CHECKPOINT_KEY, LEGACY_KEY)}
        assert found == model(batches(7, 5)[:3])
    finally:
        cache.close()
