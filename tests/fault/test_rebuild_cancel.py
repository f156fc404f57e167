"""SIGTERM during a long cache rebuild: the worker stops at once, exit code 0, and the
cache keeps what was applied, so the next start replays only the rest.

A journal of RECORDS ActionState records is written straight to the topic (as
bench/bench_rebuild.py does); the worker is stopped shortly after it opened the cache.
The stop latency is printed; the only timed assertion is a generous bound.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.kafka.config import producer_config
from agents_stream.serde.journal import default_journal_codec
from agents_stream.testing.topics import create_topics
from tests.fault.scenario import wait_log

pytestmark = [pytest.mark.broker, pytest.mark.fault]

RECORDS = 300_000
RESULT = b'{"receipt":"r-0000000000","amount":12.5,"tags":["a","b","c"]}'


def write_journal(bootstrap: str, topic: str, input_topic: str) -> None:
    codec = default_journal_codec(None, topic)
    producer = Producer(
        producer_config(
            bootstrap,
            {
                "linger.ms": 50,
                "queue.buffering.max.messages": 1_000_000,
                "enable.idempotence": False,
            },
        )
    )
    for seq in range(RECORDS):
        # Distinct keys: compaction cannot shrink what the rebuild has to read.
        ref = ActionRef(f"user-{seq % 5000}", seq, "Stamp.process#0", 0, input_topic)
        entry = CallEntry(
            ref,
            0,
            "record",
            "9f86d081884c7d659a2feaa0c55ad015",
            CallStatus.SUCCEEDED,
            RESULT,
            call_id=ref.call_id("rebuild", 0),
            started_ms=1_700_000_000_000,
            finished_ms=1_700_000_000_100,
            worker_id="writer",
        )
        while True:
            try:
                producer.produce(
                    topic, key=entry_key_bytes(entry), value=codec.encode(entry), partition=0
                )
                break
            except BufferError:
                producer.poll(0.1)
        if seq % 5000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def written_bytes(cache: Path) -> int:
    """Bytes RocksDB wrote for the cache: a rebuild skips the write-ahead log, so its
    batches show as flushed tables."""
    total = 0
    for table in [*cache.glob("[0-9]*.sst"), *cache.glob("[0-9]*.log")]:
        try:
            total += table.stat().st_size
        except FileNotFoundError:  # compacted or rotated away meanwhile
            pass
    return total


def test_sigterm_during_cache_rebuild_stops_promptly_and_keeps_the_checkpoint(
    broker, topic_factory, worker_factory, tmp_path, capsys
):
    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(tmp_path / "effects.sqlite"),
    }
    state_topic = f"{env['AS_APP_ID']}-action-state"
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=1)
    TopicAdmin(broker.bootstrap).ensure([compacted(state_topic, 1)])
    write_journal(broker.bootstrap, state_topic, env["AS_INPUT"])

    data = tmp_path / "data"
    cache = data / env["AS_APP_ID"] / "action-state" / "p0"
    worker = worker_factory(
        "tests.apps.failover_app:app", env, extra_args=["--data-dir", str(data)]
    )
    deadline = time.monotonic() + 120
    while not cache.exists():  # the cache is opened right before its rebuild
        assert worker.alive and time.monotonic() < deadline, worker.log()
        time.sleep(0.02)
    # Stop once the first batches are applied (the first memtable is flushed); the whole
    # rebuild takes ~2 s here, so a fixed delay raced it.
    while written_bytes(cache) < 100_000:
        assert worker.alive and time.monotonic() < deadline, worker.log()
        time.sleep(0.005)
    assert worker.proc is not None
    stop_sent = time.monotonic()
    code = worker.terminate(timeout=30)
    stopped_in = time.monotonic() - stop_sent
    log = worker.log()
    assert code == 0, log
    assert "assigned " not in log, "the rebuild finished before the stop; raise RECORDS"
    found = re.search(r"cancelled after (\d+) records", log)
    assert found, log
    applied = int(found.group(1))
    assert stopped_in < 30

    # The next start goes on from the checkpoint the cancelled rebuild left.
    again = worker_factory("tests.apps.failover_app:app", env, extra_args=["--data-dir", str(data)])
    wait_log(again, "replayed", timeout=120)
    replayed = int(re.search(r"replayed (\d+) journal records", again.log()).group(1))  # type: ignore[union-attr]
    assert again.terminate() == 0, again.log()
    with capsys.disabled():
        print(
            f"\nrebuild cancel: SIGTERM {stopped_in:.2f} s to exit 0 after {applied} of "
            f"{RECORDS} records applied; the restart replayed {replayed}"
        )
    assert 0 < applied < RECORDS
    assert applied + replayed == RECORDS
