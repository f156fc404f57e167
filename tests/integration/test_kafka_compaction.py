"""The ActionState topic really compacts on Apache Kafka, and a cache rebuilt from the
compacted topic is the cache rebuilt from the full one.

The embedded broker never compacts, so only Kafka shows that pruning (tombstones for the
ActionStates of committed records) and compaction (superseded records dropped, tombstones
dropped after ``delete.retention.ms``) leave a journal a fresh worker rebuilds the same
call slots, memory and completed-through markers from, and that a pruned record does not
come back once its tombstone is gone.

The ActionState topic is created by the test, before the worker (which checks an
existing one is compacted and co-partitioned, then uses it): small ``segment.ms`` so the
journal spreads over many segments, ``min.cleanable.dirty.ratio`` 0.01 and
``delete.retention.ms`` 100 ms so the cleaner acts within seconds (the test broker's
``log.cleaner.backoff.ms`` is 1 s). ``min.compaction.lag.ms`` holds the cleaner off
while the worker runs, so the "before" rebuild reads every record ever written; it is
then set to 0 and the test waits for the cleaner (see below for what keeps it going).

Kafka only: run with ``--broker=kafka`` (or ``both``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from agents_stream.state.cache import PartitionCache
from agents_stream.testing.topics import create_topics, produce, wait_for_records
from tests.apps.effects import REEXECUTED_AFTER_ACK, connect

pytestmark = [pytest.mark.broker, pytest.mark.kafka_only]

PARTITIONS = 2
KEYS = 8  # the same keys every round: their memory snapshots are superseded
ROUNDS = 5
PER_ROUND = 16
APP = "tests.apps.crashy:app"


def raw_journal(bootstrap: str, topic: str) -> list[tuple[int, int, bytes, bytes | None]]:
    """(partition, offset, key, value) of every record, read with a plain consumer."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: list[tuple[int, int, bytes, bytes | None]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    at_end.add(msg.partition())
                    continue
                at_end.discard(msg.partition())
                out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    assert len(at_end) == PARTITIONS, "the journal was not read to its end in 30 s"
    return sorted(out, key=lambda r: (r[0], r[1]))


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def summary(records: list[tuple[int, int, bytes, bytes | None]]) -> dict[str, int]:
    keys = Counter((p, k) for p, _, k, _ in records)
    return {
        "records": len(records),
        "tombstones": sum(v is None for *_, v in records),
        "superseded": sum(n - 1 for n in keys.values()),
        "keys": len(keys),
    }


def last_values(records: list[tuple[int, int, bytes, bytes | None]]) -> dict[bytes, bytes | None]:
    last: dict[bytes, bytes | None] = {}
    for _, _, key, value in records:
        last[key] = value
    return last


def cache_contents(data_dir: Path, app_id: str) -> dict[int, dict[bytes, bytes]]:
    """What a (stopped) worker's RocksDB caches hold, per partition, without the cache's
    own bookkeeping keys (checkpoint, legacy flag: they start with a NUL byte)."""
    out: dict[int, dict[bytes, bytes]] = {}
    for p in range(PARTITIONS):
        path = data_dir / app_id / "action-state" / f"p{p}"
        assert path.is_dir(), f"no cache for partition {p} in {data_dir}"
        cache = PartitionCache(path)
        try:
            out[p] = {k: v for k, v in cache.rocksdb_scan(b"") if not k.startswith(b"\x00")}
        finally:
            cache.close()
    return out


def kinds(contents: dict[int, dict[bytes, bytes]]) -> Counter[str]:
    return Counter(k.split(b"\x1f")[0].decode() for part in contents.values() for k in part)


def replayed(log: str) -> int:
    return sum(int(m) for m in re.findall(r"replayed (\d+) journal records", log))


def set_topic_config(bootstrap: str, topic: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in config.items()
    ]
    res = ConfigResource("topic", topic, incremental_configs=entries)
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=30)


def rebuild(worker_factory, env, data_dir: Path):  # type: ignore[no-untyped-def]
    """A fresh worker (empty data dir) rebuilds its caches, then stops gracefully."""
    worker = worker_factory(APP, env, extra_args=["--data-dir", str(data_dir)])
    deadline = time.monotonic() + 90
    while len(re.findall(r"assigned .*replayed", worker.log())) < 1:
        assert worker.alive and time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.2)
    assert worker.terminate() == 0, worker.log()[-3000:]
    return worker


def test_compacted_journal_rebuilds_the_same_cache(
    broker, topic_factory, worker_factory, tmp_path, capsys
):
    db = tmp_path / "effects.sqlite"
    connect(str(db)).close()
    app_id = topic_factory("app")
    env = {
        "AS_APP_ID": app_id,
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_EFFECTS_DB": str(db),
        "AS_COMMIT_INTERVAL": "0.3",
    }
    state = f"{app_id}-action-state"
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=PARTITIONS)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "cleanup.policy": "compact",
        "segment.ms": "300",  # a new segment for nearly every burst of journal writes
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100",
        "min.compaction.lag.ms": str(24 * 3600 * 1000),  # held off until released below
    }
    for fut in admin.create_topics([NewTopic(state, PARTITIONS, 1, config=config)]).values():
        fut.result(timeout=30)

    # -- the worker journals, prunes what it committed; nothing is cleaned yet --------
    worker = worker_factory(APP, env, extra_args=["--data-dir", str(tmp_path / "first")])
    n = 0
    last_round_from: dict[int, int] = {}
    for r in range(ROUNDS):
        if r == ROUNDS - 1:  # what precedes the last round lies in closed segments
            last_round_from = end_offsets(broker.bootstrap, state)
        batch = [
            (f"key-{i % KEYS}", {"scenario": "two-actions", "n": n + i}) for i in range(PER_ROUND)
        ]
        produce(broker.bootstrap, env["AS_INPUT"], batch)
        n += PER_ROUND
        wait_for_records(broker.bootstrap, env["AS_OUTPUT"], n, timeout=90)
        time.sleep(0.6)  # past segment.ms: the next round's journal opens new segments
    time.sleep(1.5)  # the last commit and its pruning
    assert worker.terminate() == 0, worker.log()[-3000:]
    first = cache_contents(tmp_path / "first", app_id)

    before = raw_journal(broker.bootstrap, state)
    # Nothing cleaned: offsets are dense from 0.
    for p in range(PARTITIONS):
        offsets = [o for q, o, _, _ in before if q == p]
        assert offsets == list(range(len(offsets))), f"partition {p} was cleaned already"
    last_before = last_values(before)
    pruned = {k for k, v in last_before.items() if v is None}
    # Every input's call and ActionDone slots were pruned (per input: 2 calls, 2 dones).
    assert len(pruned) >= n * 4, summary(before)

    # The "before" view: a fresh worker's rebuild from every record ever written.
    before_worker = rebuild(worker_factory, env, tmp_path / "before")
    rebuilt_before = cache_contents(tmp_path / "before", app_id)

    # -- compaction released ---------------------------------------------------------
    set_topic_config(broker.bootstrap, state, min_compaction_lag_ms="0")
    released = time.monotonic()
    # Cleaned: superseded records and the tombstones of early rounds gone. The active
    # segment (the last burst of writes) is never cleaned, so what it holds stays.
    early_pruned = {
        (p, k) for p, o, k, v in before if v is None and k in pruned and o < last_round_from[p]
    }
    assert early_pruned
    # A tombstone goes in a cleaning pass after the one that set its delete horizon, and
    # the cleaner only passes again over new dirty data in a closed segment. A worker
    # with traffic writes that all the time; here the latest live record of each
    # partition is written again every second (its value is already the key's value,
    # so nothing a reader rebuilds changes), which also rolls the segment before it.
    ticks = [
        max(((o, k, v) for q, o, k, v in before if q == p and last_before[k] is not None))
        for p in range(PARTITIONS)
    ]
    assert all(last_before[k] == v for _, k, v in ticks)
    ticker = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    deadline = time.monotonic() + 120
    while True:
        for p, (_, key, value) in enumerate(ticks):
            ticker.produce(state, key=key, value=value, partition=p)
        assert ticker.flush(30) == 0
        after = raw_journal(broker.bootstrap, state)
        present = {(p, k) for p, _, k, _ in after}
        back = early_pruned & present
        if not back or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    cleaned_in = time.monotonic() - released
    assert not back, f"{len(back)} early pruned keys still in the topic: {sorted(back)[:5]}"

    # Compaction keeps the last value of every key: the live view did not change.
    last_after = last_values(after)
    assert {k: v for k, v in last_after.items() if v is not None} == {
        k: v for k, v in last_before.items() if v is not None
    }

    # -- a fresh worker rebuilds from the compacted topic --------------------------------
    after_worker = rebuild(worker_factory, env, tmp_path / "after")
    rebuilt_after = cache_contents(tmp_path / "after", app_id)
    assert rebuilt_after == rebuilt_before  # same call slots, memory, markers, byte for byte
    assert rebuilt_after == first  # and what the worker that wrote them held at its end
    held = kinds(rebuilt_after)
    assert held["m"] == KEYS and held["p"] >= PARTITIONS, held  # memory and markers
    live = {k for part in rebuilt_after.values() for k in part}
    assert not live & pruned  # a pruned record never comes back

    # -- and it goes on from there: memory continues, nothing already done runs again ---
    last = worker_factory(APP, env, extra_args=["--data-dir", str(tmp_path / "after")])
    batch = [(f"key-{i % KEYS}", {"scenario": "two-actions", "n": n + i}) for i in range(KEYS)]
    produce(broker.bootstrap, env["AS_INPUT"], batch)
    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], n + KEYS, timeout=90)
    assert last.terminate() == 0, last.log()[-3000:]
    values = [r.json() for r in outputs]
    assert Counter(v["n"] for v in values) == Counter(range(n + KEYS))  # each input once
    per_key = ROUNDS * PER_ROUND // KEYS
    assert sorted(v["count"] for v in values if v["n"] >= n) == [per_key + 1] * KEYS
    con = connect(str(db))
    (reexecuted_acked,) = con.execute(REEXECUTED_AFTER_ACK).fetchone()
    (twice,) = con.execute(
        "SELECT COUNT(*) FROM (SELECT call_id FROM effects GROUP BY call_id HAVING COUNT(*) > 1)"
    ).fetchone()
    con.close()
    assert reexecuted_acked == 0 and twice == 0

    b, a = summary(before), summary(after)
    with capsys.disabled():
        print(
            f"\ncompaction ({ROUNDS} rounds x {PER_ROUND} inputs, {KEYS} keys, "
            f"{PARTITIONS} partitions): before {b['records']} records ({b['tombstones']} "
            f"tombstones, {b['superseded']} superseded, {b['keys']} keys); after "
            f"{a['records']} records ({a['tombstones']} tombstones, {a['superseded']} "
            f"superseded, {a['keys']} keys) {cleaned_in:.1f}s after compaction was released; "
            f"a fresh rebuild replayed {replayed(before_worker.log())} records before, "
            f"{replayed(after_worker.log())} after, its cache "
            f"{dict(held)} identical to the pre-compaction rebuild; pruned keys back: 0"
        )
    assert a["records"] < b["records"] and a["tombstones"] < b["tombstones"]
