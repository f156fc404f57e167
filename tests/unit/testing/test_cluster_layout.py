"""KafkaCluster's addresses (no JVM started): on loopback by default; given a network,
every node on its bridge and each isolated node in a namespace of its own, named in the
controller quorum by that namespace's address (so the others reach it, and stop reaching
it when its link is cut)."""

from __future__ import annotations

import pytest

from agents_stream.testing.cluster import KafkaCluster
from agents_stream.testing.netns import Network, netns_missing


def _voters(cluster: KafkaCluster) -> dict[int, str]:
    raw = cluster.nodes[0].server_properties()["controller.quorum.voters"]
    return {int(v.split("@")[0]): v.split("@")[1] for v in raw.split(",")}


def test_loopback_by_default(tmp_path):
    cluster = KafkaCluster(3, data_dir=tmp_path)
    assert {n.host for n in cluster.nodes} == {"127.0.0.1"}
    assert all(n.namespace is None for n in cluster.nodes)
    assert set(_voters(cluster)) == {1, 2, 3}
    with pytest.raises(ValueError, match="not isolated"):
        cluster.cut(3)


def test_isolated_nodes_need_a_network_and_real_ids(tmp_path):
    with pytest.raises(ValueError, match="need a network"):
        KafkaCluster(3, data_dir=tmp_path, isolated=(3,))
    with pytest.raises(ValueError, match=r"node ids are 1\.\.3"):
        KafkaCluster(3, data_dir=tmp_path, network=Network(subnet=9), isolated=(4,))


@pytest.mark.skipif(netns_missing() is not None, reason=str(netns_missing()))
def test_an_isolated_node_listens_in_its_namespace(tmp_path):
    with Network(subnet=251) as net:
        cluster = KafkaCluster(3, data_dir=tmp_path, network=net, isolated=(3,))
        one, _, three = cluster.nodes
        assert one.namespace is None and one.host == net.gateway
        assert three.namespace is not None and three.host == three.namespace.address
        props = three.server_properties()
        assert props["listeners"].startswith(f"PLAINTEXT://{three.host}:")
        assert _voters(cluster)[3] == f"{three.host}:{three.controller_port}"
        assert _voters(cluster)[1] == f"{net.gateway}:{one.controller_port}"
        assert three.bootstrap in cluster.bootstrap
