"""Network partitions for fault tests: processes in Linux network namespaces, cut off from
the broker by taking a link down.

A test tool, like :mod:`.kafka`: needs root and iproute2 (``ip``). ``tc netem`` is not
assumed, so a cut is a link taken down, which drops every packet silently in both
directions (what a switch failure or a partitioned VPC looks like to both ends: no RST, no
ICMP, TCP retransmits into the void until the link comes back)::

    with Network() as net:                      # a bridge in the root namespace
        broker = KafkaBroker(host=net.gateway)  # listens on the bridge's address
        ns = net.namespace("victim")            # a netns with a veth on the bridge
        proc = subprocess.Popen(ns.command([python, "-m", ...]))
        ns.cut()                                # link down: silence
        ns.heal()                               # link up: the TCP sessions resume

Why a bridge: the broker's address must stay reachable from the root namespace (the test
process, the workers not cut) while one namespace's link is down, so it lives on the
bridge, not on any veth; each namespace's root-side veth end is a bridge port, and taking
that port down cuts that namespace alone. Everything is removed on exit (the namespaces
with their veth ends, then the bridge), also after a failed test; :func:`netns_missing`
says in one line why the tool cannot run here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["Namespace", "Network", "netns_missing"]


def netns_missing() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "no `ip` (iproute2): network partition tests need it"
    if os.geteuid() != 0:
        return "not root: network partition tests create network namespaces"
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip() or out.returncode}")


class Namespace:
    """One network namespace with a veth link to the :class:`Network`'s bridge."""

    def __init__(self, network: Network, name: str, link: str, address: str) -> None:
        self.network = network
        self.name = name  # the netns
        self.link = link  # the root-side veth end (a bridge port): what a cut takes down
        self.address = address
        self.cuts = 0
        self.down = False  # cut now

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this namespace (same process id: ``ip netns exec`` execs)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Take the link down: every packet to and from the namespace is dropped."""
        _ip("link", "set", self.link, "down")
        self.cuts += 1
        self.down = True

    def heal(self) -> None:
        _ip("link", "set", self.link, "up")
        self.down = False

    def remove(self) -> None:
        # Deleting the namespace deletes its veth end, and with it the peer.
        _ip("link", "del", self.link, check=False)
        _ip("netns", "del", self.name, check=False)


class Network:
    """A bridge in the root namespace (address :attr:`gateway`) and namespaces on it.

    ``subnet``: the third octet of ``10.253.<subnet>.0/24`` (default from the process id,
    so two runs on one machine rarely collide; the names carry it too)."""

    def __init__(self, subnet: int | None = None) -> None:
        self.subnet = subnet if subnet is not None else 1 + os.getpid() % 250
        self.bridge = f"as53br{self.subnet}"
        self.gateway = f"10.253.{self.subnet}.1"
        self.namespaces: list[Namespace] = []

    def start(self) -> Network:
        self.remove()  # leftovers of a run that was killed before its cleanup
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def namespace(self, label: str = "ns") -> Namespace:
        n = len(self.namespaces) + 1
        name = f"as53-{self.subnet}-{n}-{label}"
        link = f"as53v{self.subnet}x{n}"[:15]
        peer = f"as53p{self.subnet}x{n}"[:15]
        address = f"10.253.{self.subnet}.{10 + n}"
        ns = Namespace(self, name, link, address)
        self.namespaces.append(ns)  # removed on exit even if the set-up fails halfway
        _ip("netns", "add", name)
        _ip("link", "add", link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", name)
        _ip("link", "set", link, "master", self.bridge)
        _ip("link", "set", link, "up")
        _ip("link", "set", "lo", "up", ns=name)
        _ip("addr", "add", f"{address}/24", "dev", peer, ns=name)
        _ip("link", "set", peer, "up", ns=name)
        _ip("route", "add", "default", "via", self.gateway, ns=name)
        return ns

    def remove(self) -> None:
        for ns in self.namespaces:
            ns.remove()
        self.namespaces.clear()
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> Network:
        try:
            return self.start()
        except BaseException:
            self.remove()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.remove()
