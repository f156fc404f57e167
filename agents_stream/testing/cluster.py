"""A three-node Apache Kafka cluster (KRaft, RF 3, min ISR 2) for the faults only
replication has: leader elections, a group or transaction coordinator moving to another
broker, rolling restarts, below-min-ISR outages. A test tool, like the one-node
:class:`~agents_stream.testing.kafka.KafkaBroker` it is made of::

    python -m agents_stream.testing.cluster          # make kafka-cluster

Each node is a combined broker+controller on its own free loopback ports and log dir,
formatted with one cluster id and a static voter set (``controller.quorum.voters``), so
any two nodes form a quorum. A node stopped (SIGTERM: a controlled shutdown) or killed
(SIGKILL) keeps its log dir and ports; :meth:`KafkaNode.start` brings it back, and
:meth:`KafkaCluster.wait_for_isr` waits until every replica caught up again.

A node can also be cut off from the network while it runs (root only, see
:mod:`.netns`): given a :class:`~agents_stream.testing.netns.Network`, the nodes listen on
its bridge, and each node named in ``isolated`` runs in a network namespace of its own,
where :meth:`KafkaCluster.cut` takes its link down (silence to the other nodes and every
client, as a failed switch port) and :meth:`KafkaCluster.heal` brings it back::

    with Network() as net, KafkaCluster(3, network=net, isolated=(3,)) as cluster:
        cluster.cut(3)          # the quorum of 1 and 2 fences node 3, elects new leaders
        cluster.heal(3)         # node 3 catches up as a follower
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from ..runtime.embedded import BrokerStartError
from .kafka import KAFKA_VERSION, KafkaBroker, _cluster_id, ensure_kafka, find_java
from .launcher import free_ports
from .netns import Namespace, Network

__all__ = ["KafkaCluster", "KafkaNode", "coordinator_partition"]


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` (a group id) or ``__transaction_state`` (a
    transactional id) whose leader coordinates ``key``: Kafka's
    ``Utils.abs(key.hashCode()) % partitions`` (``abs`` there is ``& 0x7fffffff``)."""
    return (_java_hash(key) & 0x7FFFFFFF) % partitions


class KafkaNode(KafkaBroker):
    """One node of a :class:`KafkaCluster`: a :class:`KafkaBroker` whose properties join
    the cluster's quorum instead of a standalone one."""

    def __init__(
        self,
        cluster: KafkaCluster,
        node_id: int,
        port: int,
        controller_port: int,
        *,
        host: str = "127.0.0.1",
        namespace: Namespace | None = None,
    ):
        super().__init__(
            port,
            host=host,
            data_dir=cluster.data_dir / f"node-{node_id}",
            properties=cluster.properties,
            heap=cluster.heap,
            version=cluster.version,
        )
        self._own_dir = False  # the cluster owns the folder
        self.cluster = cluster
        self.node_id = node_id
        self.controller_port = controller_port
        self.namespace = namespace  # its own network namespace: it can be cut off

    def server_properties(self) -> dict[str, str]:
        props = super().server_properties()
        c = self.cluster
        props.pop("controller.quorum.bootstrap.servers", None)
        props.update(
            {
                "node.id": str(self.node_id),
                "controller.quorum.voters": c.voters,
                "offsets.topic.replication.factor": str(c.replication),
                "transaction.state.log.replication.factor": str(c.replication),
                "transaction.state.log.min.isr": str(c.min_isr),
                "share.coordinator.state.topic.replication.factor": str(c.replication),
                "share.coordinator.state.topic.min.isr": str(c.min_isr),
                "default.replication.factor": str(c.replication),
                "min.insync.replicas": str(c.min_isr),
                "unclean.leader.election.enable": "false",
            }
        )
        props.update(c.properties)
        return props

    def _format(self, java: str, lib: Path, config: Path) -> None:
        """Format with the cluster's id, for the static voter set (no --standalone)."""
        if (self.log_dir / "meta.properties").exists():
            return
        cmd = self._java_cmd(
            java, lib, "kafka.tools.StorageTool", "format", "-t", self.cluster.cluster_id,
            "-c", str(config),
        )  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-5:])
            raise BrokerStartError(
                f"kafka storage format of node {self.node_id} failed ({out.returncode}): {tail}"
            )

    def start(self, timeout: float = 120.0) -> KafkaNode:
        """Start this node's process; waits until it serves metadata once the cluster is
        up (the first start of all nodes waits in :meth:`KafkaCluster.start`)."""
        if self.running:
            return self
        began = time.monotonic()
        java = find_java()
        lib = ensure_kafka(self.version)
        config = self._write_config()
        self._format(java, lib, config)
        self.log_file = self.log_file or self._dir / "server.log"
        cmd = self._java_cmd(java, lib, "kafka.Kafka", str(config))
        # `ip netns exec` execs the JVM: same pid, so stop and kill reach it as before.
        self._spawn(self.namespace.command(cmd) if self.namespace is not None else cmd)
        if self.cluster.started:
            self._wait_ready(began + timeout)
        self.start_seconds = time.monotonic() - began
        return self


class KafkaCluster:
    """``nodes`` KRaft nodes (broker+controller each) on loopback, replication
    ``min(3, nodes)`` and ``min.insync.replicas`` one less for every topic, internal ones
    included.

    Args:
        nodes: how many nodes (3: a majority survives one node down).
        data_dir: one folder per node under it (a temporary folder, removed on
            ``__exit__``, when omitted).
        properties: extra or overriding server properties for every node.
        heap: JVM heap options per node (default ``-Xmx384m -Xms128m``).
        network: listen on this network's bridge instead of loopback (root only).
        isolated: node ids run in a network namespace of their own on ``network``, to
            :meth:`cut` and :meth:`heal`.
    """

    kind: Literal["kafka"] = "kafka"

    def __init__(
        self,
        nodes: int = 3,
        *,
        data_dir: str | Path | None = None,
        properties: Mapping[str, str | int] | None = None,
        heap: str | None = None,
        version: str = KAFKA_VERSION,
        network: Network | None = None,
        isolated: Iterable[int] = (),
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        isolated = set(isolated)
        if isolated and network is None:
            raise ValueError("isolated nodes need a network (agents_stream.testing.netns)")
        if not isolated <= set(range(1, nodes + 1)):
            raise ValueError(f"isolated {sorted(isolated)}: node ids are 1..{nodes}")
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="agents-stream-cluster-"))
        self.properties = {k: str(v) for k, v in (properties or {}).items()}
        self.heap = heap or "-Xmx384m -Xms128m"
        self.version = version
        self.replication = min(3, nodes)
        self.min_isr = max(1, self.replication - 1)
        self.cluster_id = _cluster_id()
        self.started = False
        self.start_seconds: float | None = None
        ports = free_ports(2 * nodes)
        self.host = "127.0.0.1" if network is None else network.gateway
        namespaces = {
            i: network.namespace(f"kafka{i}") for i in sorted(isolated) if network is not None
        }
        hosts = {
            i: namespaces[i].address if i in namespaces else self.host for i in range(1, nodes + 1)
        }
        self.voters = ",".join(f"{i + 1}@{hosts[i + 1]}:{ports[nodes + i]}" for i in range(nodes))
        self.nodes = [
            KafkaNode(
                self, i + 1, ports[i], ports[nodes + i],
                host=hosts[i + 1], namespace=namespaces.get(i + 1),
            )
            for i in range(nodes)
        ]  # fmt: skip

    # -- addresses ----------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> KafkaCluster:
        """Start every node (they need each other for a quorum), then wait until the
        metadata lists all of them."""
        began = time.monotonic()
        with ThreadPoolExecutor(len(self.nodes)) as pool:  # the formats run in parallel
            list(pool.map(lambda n: n.start(timeout), self.nodes))
        self.started = True
        self._wait_brokers(len(self.nodes), began + timeout)
        self.start_seconds = time.monotonic() - began
        return self

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        # Not through a node that is cut off: a request to it waits for nothing.
        reachable = [n.bootstrap for n in self.nodes if n.namespace is None or not n.namespace.down]
        return AdminClient({"bootstrap.servers": ",".join(reachable), "log_level": 0})

    def _wait_brokers(self, count: int, deadline: float) -> None:
        admin = self._admin()
        last: object = None
        while time.monotonic() < deadline:
            for n in self.nodes:
                proc = n._proc
                if proc is not None and proc.poll() is not None:
                    raise BrokerStartError(
                        f"kafka node {n.node_id} exited with code {proc.returncode} "
                        f"({n.log_file}): {n._log_tail()}"
                    )
            try:
                md = admin.list_topics(timeout=2.0)
                if len(md.brokers) >= count:
                    return
                last = f"{len(md.brokers)} of {count} brokers registered"
            except Exception as exc:
                last = exc
            time.sleep(0.3)
        self.stop()
        raise BrokerStartError(f"kafka cluster on {self.bootstrap} not ready in time: {last}")

    def stop(self) -> None:
        """All nodes at once: one by one, the last node's controlled shutdown waits for a
        quorum already gone (it was SIGKILLed after 30 s; all at once took 7-8 s)."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.stop(), self.nodes))
        self.started = False

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    # -- network partitions -------------------------------------------------------------
    def cut(self, node_id: int) -> None:
        """Take node ``node_id``'s link down (it keeps running, unreachable)."""
        self._namespace(node_id).cut()

    def heal(self, node_id: int) -> None:
        self._namespace(node_id).heal()

    def _namespace(self, node_id: int) -> Namespace:
        ns = self.node(node_id).namespace
        if ns is None:
            raise ValueError(f"node {node_id} is not isolated (KafkaCluster(isolated=...))")
        return ns

    # -- who leads what -----------------------------------------------------------------
    def led_by(self, node_id: int, topics: Iterable[str] | None = None) -> list[str]:
        """The partitions (``topic[p]``) node ``node_id`` leads in the metadata the other
        nodes answer with (all topics, internal ones included, unless ``topics``)."""
        md = self._admin().list_topics(timeout=10)
        wanted = None if topics is None else set(topics)
        return [
            f"{t}[{p}]"
            for t, tm in md.topics.items()
            if wanted is None or t in wanted
            for p, pm in tm.partitions.items()
            if pm.leader == node_id
        ]

    def leader(self, topic: str, partition: int) -> int:
        """The node id leading ``topic[partition]`` (-1: none now)."""
        md = self._admin().list_topics(topic, timeout=10)
        tm = md.topics.get(topic)
        pm = tm.partitions.get(partition) if tm is not None else None
        return -1 if pm is None else int(pm.leader)  # e.g. not created yet

    def group_coordinator(self, group_id: str) -> int:
        """The node coordinating consumer group ``group_id``: the leader of its
        ``__consumer_offsets`` partition."""
        partitions = int(self._internal("offsets.topic.num.partitions", 8))
        return self.leader("__consumer_offsets", coordinator_partition(group_id, partitions))

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``: the leader of its
        ``__transaction_state`` partition."""
        partitions = int(self._internal("transaction.state.log.num.partitions", 8))
        key = coordinator_partition(transactional_id, partitions)
        return self.leader("__transaction_state", key)

    def _internal(self, name: str, default: int) -> str:
        return self.nodes[0].server_properties().get(name, str(default))

    def wait_for_isr(self, topics: list[str] | None = None, timeout: float = 120.0) -> None:
        """Until every partition of ``topics`` (default: all, internal ones included) has
        a leader and its full replica set in sync."""
        admin, deadline, lagging = self._admin(), time.monotonic() + timeout, ["?"]
        while time.monotonic() < deadline:
            try:
                md = admin.list_topics(timeout=5)
                # A topic this broker's metadata does not have yet (just created, or a
                # node just restarted) has no partitions to lag: it is not in sync either.
                lagging = [
                    f"{t} (not in this broker's metadata yet)"
                    for t in topics or ()
                    if t not in md.topics or not md.topics[t].partitions
                ] + [
                    f"{t}[{p}]"
                    for t, tm in md.topics.items()
                    if topics is None or t in topics
                    for p, pm in tm.partitions.items()
                    if pm.leader < 0 or len(pm.isrs) < len(pm.replicas)
                ]
                errors = [
                    t
                    for t, tm in md.topics.items()
                    if (topics is None or t in topics) and tm.error is not None
                ]
                if not md.topics or errors:
                    lagging.append(f"metadata incomplete {errors[:3]}")
                if not lagging and len(md.brokers) == len(self.nodes):
                    return
            except Exception as exc:
                lagging = [str(exc)]
            time.sleep(0.5)
        raise TimeoutError(f"replicas not in sync after {timeout:.0f}s: {lagging[:10]}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m agents_stream.testing.cluster",
        description="Run an Apache Kafka KRaft cluster (RF 3, min ISR 2) in the foreground.",
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--data-dir", help="keep the log dirs here (default: a temp dir)")
    args = parser.parse_args(argv)
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with KafkaCluster(args.nodes, data_dir=args.data_dir) as cluster:
            print(
                f"Apache Kafka cluster of {args.nodes} up in {cluster.start_seconds:.1f}s "
                f"(data {cluster.data_dir}); Ctrl-C stops it",
                file=sys.stderr,
            )
            print(f"AGENTS_STREAM_BROKER={cluster.url}", flush=True)
            while not stopping:
                time.sleep(0.5)
        return 0
    except BrokerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
