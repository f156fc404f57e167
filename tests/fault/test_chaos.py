"""(f) Chaos: repeated random SIGKILLs while 2,000 inputs x 3 journaled calls flow.

Lost inputs, acknowledged calls executed again and duplicate outputs must all be 0 (an
output acked just before a kill, whose emitted marker was not, is found in the output
topic by the next owner and not sent again: ``host/output_log.py``)."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from agents_stream.testing.topics import create_topics, produce, read_topic
from tests.apps.effects import REEXECUTED_AFTER_ACK, connect
from tests.fault.fleet import assert_survivors

pytestmark = [pytest.mark.broker, pytest.mark.fault]

INPUTS = 2000
KEYS = 4  # few keys: the run spans many kills (same key is sequential)


# Its own deadline (480 s below) governs: eight kills each wait out a 6 s session
# timeout, and the app's async action runs its sync code blocks inline, one at a time.
@pytest.mark.kafka_proof
@pytest.mark.timeout(600)
def test_f_chaos_random_sigkills(broker, topic_factory, worker_factory, tmp_path, capsys):
    _chaos(broker, topic_factory, worker_factory, tmp_path, capsys, "at-least-once")


# The embedded broker's read_committed readers see aborted records: Kafka proves it.
@pytest.mark.kafka_only
@pytest.mark.timeout(600)
def test_f_chaos_exactly_once(broker, topic_factory, worker_factory, tmp_path, capsys):
    """Every output is read read_committed (as every reader here): one of a transaction
    that a kill aborted is never seen, and none is seen twice."""
    _chaos(broker, topic_factory, worker_factory, tmp_path, capsys, "exactly-once")


def _chaos(broker, topic_factory, worker_factory, tmp_path, capsys, guarantee: str) -> None:
    rng = random.Random(20261122)
    mode = ["--processing-guarantee", guarantee]
    # Exactly-once: after each kill the dead worker's open transaction holds the
    # partitions' last stable offset until the broker aborts it (10 s): fewer kills.
    most_kills = 5 if guarantee == "exactly-once" else 8
    db_path = tmp_path / "effects.sqlite"
    connect(str(db_path)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db_path),
        "AS_COMMIT_INTERVAL": "0.3",
    }
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=4)
    produce(
        broker.bootstrap,
        env["AS_INPUT"],
        [(f"key-{n % KEYS}", {"scenario": "calls", "n": n, "delay": 0.02}) for n in range(INPUTS)],
    )
    kills = 0
    worker = worker_factory("tests.apps.crashy:app", env, extra_args=mode)
    deadline = time.monotonic() + 480

    def produced() -> set[int]:
        return {r.json()["n"] for r in read_topic(broker.bootstrap, env["AS_OUTPUT"])}

    while time.monotonic() < deadline and len(produced()) < INPUTS:
        # Kill only once this worker is mid-stream (its outputs are growing), so every
        # SIGKILL lands inside actions rather than in a group join.
        before = len(produced())
        while time.monotonic() < deadline:
            # Grown by 20, or done (fewer than 20 left: the run would wait out its deadline)
            now = len(produced())
            if now > before + 20 or now >= INPUTS:
                break
            time.sleep(0.2)
        time.sleep(rng.uniform(0.2, 1.5))
        if kills >= most_kills or len(produced()) >= INPUTS:
            continue
        worker.kill()
        kills += 1
        # every third restart starts from an empty cache: full rebuild from the topic
        extra = ["--data-dir", str(tmp_path / f"fresh-{kills}")] if kills % 3 == 0 else []
        worker = worker_factory("tests.apps.crashy:app", env, extra_args=[*mode, *extra])
    outputs = read_topic(broker.bootstrap, env["AS_OUTPUT"])
    assert_survivors([worker])  # the last one, never killed: alive, no CRITICAL line
    worker.terminate()

    per_input = Counter(r.json()["n"] for r in outputs)
    lost = INPUTS - len(per_input)
    duplicates = sum(c - 1 for c in per_input.values())
    db = connect(str(db_path))
    (reexecuted_acked,) = db.execute(REEXECUTED_AFTER_ACK).fetchone()
    (executions,) = db.execute("SELECT COUNT(*) FROM effects").fetchone()
    (distinct_calls,) = db.execute("SELECT COUNT(DISTINCT call_id) FROM effects").fetchone()
    with capsys.disabled():
        print(
            f"\nchaos ({guarantee}): {INPUTS} inputs x 3 calls, {kills} SIGKILLs: lost inputs={lost}, "
            f"re-executed acked calls={reexecuted_acked}, executions={executions} for "
            f"{distinct_calls} calls ({executions - distinct_calls} re-run before their ack), "
            f"duplicate outputs={duplicates}"
        )
    assert kills >= 3, "the run finished before enough crashes; raise INPUTS"
    assert lost == 0, worker.log()
    assert reexecuted_acked == 0
    assert duplicates == 0, worker.log()
    assert distinct_calls == INPUTS * 3
    for n, results in ((r.json()["n"], r.json()["results"]) for r in outputs):
        assert results == [f"fetch-{n}", f"score-{n}", f"notify-{n}"]
