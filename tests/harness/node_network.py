"""The network several nodes on one machine share: a bridge in a namespace of its own.

``NodeNetwork`` is a /24 (``172.31.<x>.0/24``) on a bridge that lives in its own
network namespace (``<prefix>-lan``), so the host's firewall (Docker's FORWARD
policy, br_netfilter) never sees the frames between nodes, and a filter on the
node network (an nft rule in that namespace) touches nothing else. The host joins
it through one veth (``.1``), which is how the nodes reach the API server and how
the API server reaches the kubelets; node ``i`` is the namespace ``<prefix>-n<i>``
with ``eth0`` at ``.<10+i>`` and its default route via the host.

Static routes (kindnet's recipe: on each node, every other node's podCIDR via that
node's address) are ``add_static_routes``; a CNI that keeps routes itself needs none.
Deleting the namespaces removes everything: veths, addresses, routes, nft and
iptables rules inside them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")
FIRST_NODE_HOST = 10  # node i has address .(10 + i)


class NodeNetworkError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise NodeNetworkError(f"ip {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def in_netns(netns: str, argv: list[str]) -> list[str]:
    """``argv`` run in the named namespace's network only (not its own mount namespace,
    which ``ip netns exec`` would make: the kubelet's mounts must reach containerd)."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


def netns_exists(netns: str) -> bool:
    return (NETNS_DIR / netns).exists()


def sysctl_in(netns: str, key: str, value: str) -> None:
    subprocess.run(in_netns(netns, ["sysctl", "-qw", f"{key}={value}"]), check=True)


@dataclass(frozen=True)
class NodeNetwork:
    prefix: str  # namespace names start with it
    subnet: str  # e.g. 172.31.25.0/24

    @classmethod
    def for_cluster(cls, name: str, octet: int) -> NodeNetwork:
        return cls(prefix=f"slk-{name}", subnet=f"172.31.{octet}.0/24")

    @property
    def lan_netns(self) -> str:
        return f"{self.prefix}-lan"

    @property
    def host_veth(self) -> str:
        # Interface names have 15 characters at most; the cluster name may not fit.
        return "slk" + hashlib.sha1(self.prefix.encode()).hexdigest()[:10]

    def _address(self, host: int) -> str:
        return str(ipaddress.IPv4Network(self.subnet).network_address + host)

    @property
    def host_address(self) -> str:
        return self._address(1)

    @property
    def prefix_length(self) -> int:
        return ipaddress.IPv4Network(self.subnet).prefixlen

    def node_netns(self, index: int) -> str:
        return f"{self.prefix}-n{index}"

    def node_address(self, index: int) -> str:
        return self._address(FIRST_NODE_HOST + index)

    # --- lifecycle --------------------------------------------------------------------

    def create(self) -> None:
        """The bridge namespace, its bridge, and the host's leg (``.1``)."""
        _ip("netns", "add", self.lan_netns)
        lan = ["-n", self.lan_netns]
        _ip(*lan, "link", "set", "lo", "up")
        _ip(*lan, "link", "add", "br0", "type", "bridge")
        _ip(*lan, "link", "set", "br0", "up")
        _ip("link", "add", self.host_veth, "type", "veth", "peer", "name", "host",
            "netns", self.lan_netns)  # fmt: skip
        _ip(*lan, "link", "set", "host", "master", "br0", "up")
        _ip("addr", "add", f"{self.host_address}/{self.prefix_length}", "dev", self.host_veth)
        _ip("link", "set", self.host_veth, "up")

    def add_node(self, index: int) -> str:
        """Node ``index``'s namespace with ``eth0`` on the bridge; returns the namespace."""
        netns = self.node_netns(index)
        _ip("netns", "add", netns)
        node = ["-n", netns]
        _ip(*node, "link", "set", "lo", "up")
        _ip(*node, "link", "add", "eth0", "type", "veth", "peer", "name", f"n{index}",
            "netns", self.lan_netns)  # fmt: skip
        _ip("-n", self.lan_netns, "link", "set", f"n{index}", "master", "br0", "up")
        _ip(*node, "addr", "add", f"{self.node_address(index)}/{self.prefix_length}", "dev", "eth0")
        _ip(*node, "link", "set", "eth0", "up")
        _ip(*node, "route", "add", "default", "via", self.host_address)
        # A new namespace forwards nothing; a node forwards between its pods and the LAN.
        sysctl_in(netns, "net.ipv4.ip_forward", "1")
        return netns

    def remove_node(self, index: int) -> None:
        netns = self.node_netns(index)
        if netns_exists(netns):
            _ip("netns", "del", netns)

    def remove(self, indexes: list[int]) -> None:
        for index in indexes:
            self.remove_node(index)
        if netns_exists(self.lan_netns):
            _ip("netns", "del", self.lan_netns)  # takes the host's veth with it
        _ip("link", "del", self.host_veth, check=False)

    # --- routes -----------------------------------------------------------------------

    def add_static_routes(self, pod_cidrs: dict[int, str]) -> None:
        """On each node, every other node's podCIDR via that node's address."""
        for index in pod_cidrs:
            for other, cidr in pod_cidrs.items():
                if other != index:
                    _ip("-n", self.node_netns(index), "route", "replace", cidr,
                        "via", self.node_address(other))  # fmt: skip

    def remove_static_routes_to(self, index: int, cidr: str, others: list[int]) -> None:
        for other in others:
            if netns_exists(self.node_netns(other)):
                _ip("-n", self.node_netns(other), "route", "del", cidr, check=False)

    def routes(self, index: int) -> list[dict[str, str]]:
        out = _ip("-n", self.node_netns(index), "-j", "-4", "route", "show").stdout
        return json.loads(out or "[]")

    def leftovers(self, indexes: list[int]) -> list[str]:
        found = [
            f"netns {ns}"
            for ns in (self.lan_netns, *(self.node_netns(i) for i in indexes))
            if netns_exists(ns)
        ]
        if _ip("link", "show", self.host_veth, check=False).returncode == 0:
            found.append(f"link {self.host_veth}")
        return found
