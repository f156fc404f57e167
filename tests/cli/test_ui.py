"""``agents-stream ui``: the console's pages over HTTP, against real worker subprocesses
on the broker. A record fails after its first journaled call (dead letter): the console
shows that call and the dead letter read-only and refuses to replay, then (with
--allow-replay) replays the dead letter under its original identity: the journaled call
is shown replayed by the second worker, not executed again. A worker killed inside a
reconcilable call leaves it PENDING until its restart reconciles it. An unreadable
journal record is shown as such and breaks no page."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import httpx
import pytest

from agents_stream.durable.journal import ActionRef
from agents_stream.durable.keys import call_key
from agents_stream.testing.topics import create_topics, produce, wait_for_records
from tests.apps.effects import connect
from tests.fault.scenario import CrashScenario

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.dlq_app:app"
CRASHY = "tests.apps.crashy:app"


class Console:
    """An ``agents-stream ui`` subprocess and an HTTP client on the address it says."""

    def __init__(self, broker, env: dict[str, str], log: Path, *extra: str, app: str = APP) -> None:
        self._log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agents_stream", "ui", "-A", app, "--broker", broker.url,
             "--port", "0", "--refresh", "0", *extra],
            env={**os.environ, **env}, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=log.open("w"),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (found := re.search(r"console on (http://\S+)/", log.read_text())):
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        self.http = httpx.Client(base_url=found.group(1), timeout=30)

    def page(self, path: str, expect: str = "", timeout: float = 30.0) -> str:
        """The page at ``path`` (200), once it shows ``expect`` (the journal is followed
        asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.http.get(path)
            assert answer.status_code == 200, answer.text
            if expect in answer.text or time.monotonic() > deadline:
                assert expect in answer.text, answer.text
                return answer.text
            time.sleep(0.2)

    def close(self) -> None:
        self.http.close()
        self.proc.terminate()
        assert self.proc.wait(30) == 0, self._log.read_text()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _produce_journal(broker, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for key, value in records:
        producer.produce(topic, value, key=key, partition=0)
    assert producer.flush(30) == 0


def test_console_pages_over_a_crashed_and_replayed_record(
    broker, topic_factory, worker_factory, tmp_path
):
    db = tmp_path / "effects.sqlite"
    connect(str(db)).close()
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db),
    }
    source, out, journal = env["AS_INPUT"], env["AS_OUTPUT"], f"{env['AS_APP_ID']}-action-state"
    create_topics(broker.bootstrap, [source], partitions=2)
    worker = worker_factory(APP, env)
    produce(broker.bootstrap, source,
            [(f"c{i % 3}", {"order": f"o{i}", "bad": i == 3}) for i in range(6)])  # fmt: skip
    assert len(wait_for_records(broker.bootstrap, out, 5, timeout=60)) == 5, worker.log()
    wait_for_records(broker.bootstrap, f"{source}-dlq", 1, timeout=30)
    time.sleep(1.0)  # commits happen meanwhile
    assert worker.terminate() == 0, worker.log()

    # Read-only: o3 (key c0) is in progress, its reservation journaled, the rest pending.
    ui = Console(broker, env, tmp_path / "ui-1.log")
    try:
        home = ui.page("/", "read to its end")
        assert f"{source}-dlq" in home and "Input partitions" in home
        history = ui.page("/key/c0", "to be replayed by the next run")
        assert "tests.apps.dlq_app.reserve" in history and "SUCCEEDED" in history
        [call_id] = re.findall(
            rf"<code>([^<]*:{source}:c0:\d+:Orders\.process#0:0)</code>", history
        )
        assert "/key/c0" in str(
            ui.http.get("/search", params={"q": call_id}, follow_redirects=True).url
        )
        letters = ui.page("/dlq", "shipping address of o3 missing")
        assert "--allow-replay" in letters and "<form" not in letters.split("</header>")[1]
        refused = ui.http.post("/dlq/replay", data={"dlq": f"{source}-dlq", "position": ""})
        assert refused.status_code == 403
        assert ui.page("/pending", "No PENDING call")
    finally:
        ui.close()

    # With --allow-replay, after the fix: the dead letter replayed from the page runs under
    # its original identity; the reservation is replayed, not executed again.
    metrics_port = _free_port()
    fixed = worker_factory(
        APP, {**env, "AS_FIXED": "1"}, extra_args=["--metrics-port", str(metrics_port)]
    )
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    ui = Console(broker, env, tmp_path / "ui-2.log", "--allow-replay", "--metrics", metrics)
    try:
        # The overview: the running worker's partitions, owner and metrics endpoint.
        home = ui.page("/", metrics)
        assert "records_total" in home and "calls_replayed_total" in home
        letters = ui.page("/dlq", "replay all 1")
        token = re.search(r'name="token" value="([^"]+)"', letters).group(1)
        position = re.search(r'name="position" value="(\d+:\d+)"', letters).group(1)
        stale = ui.http.post("/dlq/replay", data={"dlq": f"{source}-dlq", "position": position,
                                                  "token": "forged"})  # fmt: skip
        assert stale.status_code == 403
        done = ui.http.post(
            "/dlq/replay",
            data={"dlq": f"{source}-dlq", "position": position, "token": token},
            follow_redirects=True,
        )
        assert done.status_code == 200 and "replayed 1 dead letter" in done.text, done.text
        receipts = wait_for_records(broker.bootstrap, out, 6, timeout=60)
        [o3] = [r for r in receipts if r.json()["order"] == "o3"]
        history = ui.page("/key/c0", "tests.apps.dlq_app.ship")
        assert re.search(r"replayed by w\d+", history), history
        identity = dict(o3.headers)["x-agents-stream-output"].decode()
        assert identity in history
        found = ui.http.get("/search", params={"q": identity}, follow_redirects=True)
        assert str(found.url).endswith("/key/c0")
    finally:
        ui.close()
    assert fixed.terminate() == 0, fixed.log()
    effects = connect(str(db)).execute("SELECT kind, call_id FROM effects").fetchall()
    assert len([c for k, c in effects if k == "reserve"]) == 6, effects  # o3's ran once

    # An unreadable journal record: shown with its key, position and reason; pages stand.
    bad_key = call_key(ActionRef("c9", 98, "Orders.process#0", 0, source), 0)
    _produce_journal(broker, journal, [(bad_key, b"\x00\x00\x00\x00\x07garbage")])
    ui = Console(broker, env, tmp_path / "ui-3.log")
    try:
        shown = ui.page("/key/c9", "Unreadable journal records")
        assert "why it cannot be read" in shown
        assert "Unreadable journal records" in ui.page("/")
        assert ui.http.get("/search", params={"q": "no-such-thing"}).status_code == 200
    finally:
        ui.close()


def test_a_pending_call_of_a_killed_worker_until_its_reconciler_settles_it(
    broker, topic_factory, worker_factory, tmp_path
):
    """A worker SIGKILLed inside a reconcilable call leaves it PENDING: the console lists
    it (and its key's page) until the restarted worker's reconciler journals its outcome;
    then the key's page and /pending's settled calls say the reconciler settled it (the
    console read the PENDING value first), naming the killed worker and the new one."""
    crash = CrashScenario(broker, topic_factory, tmp_path, partial(worker_factory, CRASHY))
    crash.arm("in-charge")
    worker = crash.start()
    crash.send({"scenario": "reconcile", "n": 50})
    crash.wait_parked("in-charge", worker)  # PENDING acked, the charge made, no result
    worker.kill()
    ui = Console(broker, crash.env, tmp_path / "ui.log", app=CRASHY)
    try:
        listed = ui.page("/pending", "crashy.charge")
        assert "key-50" in listed and "reconciler of" in listed
        assert "PENDING" in ui.page("/key/key-50", "crashy.charge")
        crash.disarm("in-charge")
        # Its commit, and so the pruning of the settled slot, waits: the key's page is
        # read before the slot is tombstoned.
        restarted = crash.start(AS_COMMIT_INTERVAL="60")
        assert crash.outputs(1)[0]["charge"] == {"charged": 50, "by": "reconciler"}
        settled = ui.page("/pending", "No PENDING call")
        # Worker ids are the fixture's --worker-id w<n>: the restarted worker settled it.
        said = r"settled by the reconciler on (w\d+) \(PENDING written by (w\d+), which"
        found = re.search(said, settled)
        assert found and found.group(1) != found.group(2), settled
        history = ui.page("/key/key-50", "settled by the reconciler")
        assert "SUCCEEDED" in history and re.search(said, history), history
        assert "inferred, not journaled" in history
    finally:
        ui.close()
    assert restarted.terminate() == 0, restarted.log()
    assert crash.effects()["charge"] == 1  # reconciled, not charged again
