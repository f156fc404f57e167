"""A crash scenario shared by the worker and Faust crash tests: fresh topics, a latch
directory the app parks on, a SQLite file counting side effects, and a way to start the
host process under test."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents_stream.testing.topics import create_topics, produce, wait_for_records
from tests.apps.effects import connect


class CrashScenario:
    def __init__(
        self,
        broker: Any,
        topic_factory: Callable[[str], str],
        tmp_path: Path,
        start: Callable[[dict[str, str]], Any],
        *,
        env: dict[str, str] | None = None,
        partitions: int = 2,
    ) -> None:
        self.broker = broker
        self._start = start
        self.latch = tmp_path / "latch"
        self.latch.mkdir()
        self.db_path = tmp_path / "effects.sqlite"
        connect(str(self.db_path)).close()
        self.env = {
            "AS_APP_ID": topic_factory("app"),
            "AS_INPUT": topic_factory("in"),
            "AS_OUTPUT": topic_factory("out"),
            "AS_LATCH_DIR": str(self.latch),
            "AS_EFFECTS_DB": str(self.db_path),
            **(env or {}),
        }
        create_topics(broker.bootstrap, [self.env["AS_INPUT"]], partitions=partitions)

    def arm(self, point: str) -> None:
        (self.latch / f"park-{point}").write_text("")

    def disarm(self, point: str) -> None:
        (self.latch / f"park-{point}").unlink(missing_ok=True)

    def wait_parked(self, point: str, proc: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.latch / f"parked-{point}").exists():
            assert proc.alive, proc.log()
            assert time.monotonic() < deadline, f"never parked at {point}\n{proc.log()}"
            time.sleep(0.05)

    def start(self, **env: str) -> Any:
        return self._start({**self.env, **env})

    def send(self, *values: dict) -> None:
        produce(
            self.broker.bootstrap,
            self.env["AS_INPUT"],
            [(f"key-{v.get('n', 0)}", v) for v in values],
        )

    def outputs(self, count: int, timeout: float = 90) -> list:
        records = wait_for_records(
            self.broker.bootstrap, self.env["AS_OUTPUT"], count, timeout=timeout
        )
        return [r.json() for r in records]

    def effects(self) -> Counter:
        db = connect(str(self.db_path))
        rows = db.execute("SELECT kind FROM effects").fetchall()
        db.close()
        return Counter(kind for (kind,) in rows)


def wait_log(proc: Any, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log():
        assert proc.alive and time.monotonic() < deadline, proc.log()
        time.sleep(0.1)
