"""A spark_app workload on the real broker: run a worker, then craft journal records.

The worker processes real inputs (calls SUCCEEDED and FAILED, two actions per normal
input, outputs); the test then writes records the worker never would at this moment
(a stuck PENDING call, a truncation, an undecodable value, a tombstoned slot) with the
journal codec and the store's key layout, exactly as a crashed or diverged worker would
have left them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from agents_stream import App
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    Truncation,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.spark.frames import ActionStateWriter
from agents_stream.testing.topics import create_topics, produce, wait_for_records
from tests.apps.effects import connect
from tests.apps.spark_app import Pipeline

APP_SPEC = "tests.apps.spark_app:app"
PROCESS = "Pipeline.process#0"


@dataclass
class SparkAppEnv:
    """Topics, env and effects DB of one spark_app instance."""

    bootstrap: str
    app_id: str
    input: str
    output: str
    db_path: Path
    latch: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, broker, topic_factory, tmp_path: Path) -> SparkAppEnv:
        db_path = tmp_path / "effects.sqlite"
        connect(str(db_path)).close()
        latch = tmp_path / "latch"
        latch.mkdir()
        made = cls(
            broker.bootstrap,
            topic_factory("app"),
            topic_factory("in"),
            topic_factory("out"),
            db_path,
            latch,
        )
        made.env = {
            "AS_APP_ID": made.app_id,
            "AS_INPUT": made.input,
            "AS_OUTPUT": made.output,
            "AS_EFFECTS_DB": str(db_path),
            "AS_LATCH_DIR": str(latch),
        }
        create_topics(broker.bootstrap, [made.input], partitions=2)
        return made

    def app(self) -> App:
        """The same App the worker builds from the env, built in the test process."""
        app = App(self.app_id, prune_completed=False, partitions=2)
        app.agent(Pipeline, input=self.input, output=self.output)
        return app

    def send(self, values: list[tuple[str, dict]]) -> None:
        produce(self.bootstrap, self.input, values)

    def outputs(self, count: int, timeout: float = 90.0):
        return wait_for_records(self.bootstrap, self.output, count, timeout=timeout)

    def effects(self) -> dict[str, int]:
        db = connect(str(self.db_path))
        rows = db.execute("SELECT kind, COUNT(*) FROM effects GROUP BY kind").fetchall()
        db.close()
        return dict(rows)


def normal_inputs(n: int) -> list[tuple[str, dict]]:
    return [(f"k{i % 3}", {"n": i}) for i in range(n)]


def craft_anomalies(env: SparkAppEnv, now_ms: int) -> None:
    """Writes: 1 stuck PENDING (1 h old), 1 fresh PENDING, 1 completed state with a
    FAILED TimeoutError call and a truncation, 1 undecodable value, 1 tombstoned slot."""
    app_id = env.app_id
    stuck = ActionRef("s1", 1000, PROCESS, 0)
    fresh = ActionRef("s2", 1001, PROCESS, 0)
    failed = ActionRef("s3", 1002, PROCESS, 0)
    gone = ActionRef("t1", 1003, PROCESS, 0)

    def call(ref: ActionRef, status: CallStatus, started: int, **kw) -> CallEntry:
        return CallEntry(
            ref,
            0,
            "tests.apps.spark_app.enrich",
            "d" * 16,
            status,
            call_id=ref.call_id(app_id, 0),
            started_ms=started,
            worker_id="w-crafted",
            **kw,
        )

    entries = [
        call(stuck, CallStatus.PENDING, now_ms - 3_600_000),
        call(fresh, CallStatus.PENDING, now_ms - 1_000),
        call(
            failed,
            CallStatus.FAILED,
            now_ms - 5_000,
            finished_ms=now_ms - 4_000,
            exception=ExceptionInfo("builtins.TimeoutError", "upstream timed out"),
        ),
        Truncation(failed, 0, "x.new", "e" * 16, "x.old", "f" * 16, dropped=2, at_ms=now_ms),
        ActionDone(failed, calls=1, finished_ms=now_ms),
        call(gone, CallStatus.SUCCEEDED, now_ms, result=b'"gone"'),
    ]
    with ActionStateWriter(env.bootstrap, env.app().action_state_topic) as writer:
        writer.write((0, e) for e in entries)
        writer.write_raw(
            [
                (0, entry_key_bytes(entries[-1]), None),  # tombstone: slot must disappear
                (0, b"c\x1fu1\x1f1004\x1fPipeline.process#0\x1f0", b"\x00garbage"),
            ]
        )


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(interval)
