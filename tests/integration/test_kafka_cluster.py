"""The three-node Apache Kafka launcher (KafkaCluster): replication 3, min ISR 2.

One cluster for the module (three JVMs: 25-40 s to start on a 2-core machine), not the
session's single broker: records acknowledged by all in-sync replicas survive the SIGKILL
of a partition's leader (a new one is elected, every record still reads back), the node
comes back on its ports and log dir and catches up (``wait_for_isr``), and the computed
group and transaction coordinators are brokers of the cluster, the group's the one Kafka
reports. Kafka only: run with ``--broker=kafka`` (or ``both``); it skips, like the other
Kafka runs, when java (or the jars and mvn) is missing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from agents_stream.testing.cluster import KafkaCluster
from agents_stream.testing.kafka import KafkaUnavailable, kafka_missing
from agents_stream.testing.topics import wait_for_records

pytestmark = [pytest.mark.broker, pytest.mark.kafka_only]

TOPIC = "replicated"
RECORDS = 100
NODE_IDS = {1, 2, 3}


def _unavailable(why: str) -> None:
    """Skip with one line naming the fix, or fail where Kafka is required (as conftest)."""
    if os.environ.get("AGENTS_STREAM_TEST_REQUIRE_KAFKA", "") not in ("", "0"):
        pytest.fail(f"Apache Kafka is required here but unavailable: {why}")
    pytest.skip(f"Apache Kafka unavailable: {why}")


def _stop_all(cluster: KafkaCluster) -> float:
    """KafkaCluster.stop (every node at once); returns the seconds it took."""
    began = time.monotonic()
    cluster.stop()
    return time.monotonic() - began


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    missing = kafka_missing()
    if missing is not None:
        _unavailable(missing)
    c = KafkaCluster(3, data_dir=tmp_path_factory.mktemp("cluster") / "nodes")
    try:
        c.start()
    except KafkaUnavailable as exc:  # e.g. mvn cannot reach Maven Central
        c.cleanup()
        _unavailable(str(exc))
    try:
        yield c
    finally:
        _stop_all(c)
        c.cleanup()


def _wait(what: str, check: Any, timeout: float) -> float:
    """Seconds until ``check()`` is true (or fail naming ``what``)."""
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.2)
    return time.monotonic() - began


def _rss_mb(pid: int | None) -> str:
    try:
        with open(f"/proc/{pid}/status") as fh:
            kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return "?"
    return f"{kb / 1024:.0f}"


def test_leader_crash_restart_and_coordinators(cluster: KafkaCluster, capsys) -> None:
    timings = [f"start {cluster.start_seconds:.1f}s"]
    rss = ", ".join(f"node {n.node_id} {_rss_mb(n.pid)} MB" for n in cluster.nodes)

    # The interface: three nodes, ids 1..3, every one in the bootstrap list and registered.
    assert cluster.kind == "kafka"
    assert [n.node_id for n in cluster.nodes] == [1, 2, 3]
    assert cluster.bootstrap == ",".join(n.bootstrap for n in cluster.nodes)
    assert cluster.url == f"kafka://{cluster.bootstrap}"
    assert all(cluster.node(i).node_id == i for i in NODE_IDS)
    assert all(n.running and n.pid is not None for n in cluster.nodes)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    assert set(admin.list_topics(timeout=10).brokers) == NODE_IDS

    # A topic replicated on all three nodes.
    admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=3)])[TOPIC].result(30)
    cluster.wait_for_isr([TOPIC], timeout=60)
    parts = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
    assert sorted(parts) == [0, 1, 2]
    assert all(set(p.replicas) == NODE_IDS == set(p.isrs) for p in parts.values())

    # 100 records acknowledged by all in-sync replicas, from an idempotent producer.
    failed: list[object] = []
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "log_level": 0,
        }
    )
    for i in range(RECORDS):
        producer.produce(
            TOPIC,
            key=f"k{i % 10}",
            value=str(i).encode(),
            on_delivery=lambda err, msg: failed.append(err) if err is not None else None,
        )
    assert producer.flush(30) == 0
    assert failed == []

    # SIGKILL the leader of partition 0: another in-sync replica takes over, nothing lost.
    victim_id = cluster.leader(TOPIC, 0)
    assert victim_id in NODE_IDS
    victim = cluster.node(victim_id)
    port, log_dir, old_pid = victim.port, victim.log_dir, victim.pid
    victim.kill()
    assert not victim.running and victim.pid is None
    elected = _wait(
        "a new leader for partition 0",
        lambda: cluster.leader(TOPIC, 0) in NODE_IDS - {victim_id},
        30,
    )
    timings.append(f"new leader of p0 after SIGKILL of node {victim_id} {elected:.1f}s")
    # A new leader's high watermark is the one it had as a follower (a fetch behind): it
    # serves up to it until the other in-sync replica fetches, so the reader polls.
    began = time.monotonic()
    records = wait_for_records(cluster.bootstrap, TOPIC, RECORDS, timeout=30)
    timings.append(f"all {RECORDS} readable again {time.monotonic() - began:.1f}s")
    assert sorted(int(r.value) for r in records if r.value is not None) == list(range(RECORDS))
    # Two in-sync replicas left = min.insync.replicas: acks=all writes still succeed.
    producer.produce(TOPIC, key="k0", value=str(RECORDS).encode())
    assert producer.flush(30) == 0
    assert failed == []

    # The node back on its ports and log dir; every replica of every topic catches up.
    began = time.monotonic()
    victim.start()
    assert victim.running and victim.pid not in (None, old_pid)
    assert (victim.port, victim.log_dir) == (port, log_dir)
    timings.append(f"node {victim_id} restart {time.monotonic() - began:.1f}s")
    began = time.monotonic()
    cluster.wait_for_isr(timeout=60)
    timings.append(f"wait_for_isr {time.monotonic() - began:.1f}s")
    parts = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
    assert all(set(p.isrs) == NODE_IDS and p.leader in NODE_IDS for p in parts.values())

    # The group coordinator computed from __consumer_offsets is the one Kafka names.
    group = "cluster-group"
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe([TOPIC])
        began = time.monotonic()
        while not consumer.assignment():
            assert time.monotonic() - began < 60, "the consumer never joined its group"
            consumer.poll(0.2)
        timings.append(f"group join {time.monotonic() - began:.1f}s")
        described = admin.describe_consumer_groups([group])[group].result(30)
        group_coordinator = cluster.group_coordinator(group)
        assert group_coordinator in NODE_IDS
        assert described.coordinator.id == group_coordinator
    finally:
        consumer.close()

    # The transaction coordinator: a broker of the cluster once __transaction_state exists
    # (created by the first init_transactions). confluent-kafka has no API naming it; it
    # is computed as the group's is (same hash, the other topic), checked against Kafka
    # just above.
    tid = "cluster-txn"
    tx = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "log_level": 0})
    began = time.monotonic()
    tx.init_transactions(60)
    timings.append(f"init_transactions {time.monotonic() - began:.1f}s")
    txn_coordinator = cluster.transaction_coordinator(tid)
    assert txn_coordinator in NODE_IDS

    stopped = _stop_all(cluster)
    timings.append(f"stop (all at once) {stopped:.1f}s")
    with capsys.disabled():
        print(
            f"\nKafkaCluster 3 nodes: {'; '.join(timings)}; RSS after start {rss}; "
            f"group coordinator {group_coordinator}, transaction coordinator "
            f"{txn_coordinator}"
        )
