"""ipMasq: masquerade pod traffic that leaves the cluster range (nftables).

Each network has one set of pod addresses and one postrouting chain in the
``ip sluice`` table:

    ip saddr @masq_<network> ip daddr != { <clusterCIDR>, 224.0.0.0/4 } masquerade

ADD adds the pod's address to the set (creating table, set and chain in the
same transaction, so concurrent ADDs are safe); DEL removes it. Pod-to-pod
traffic stays inside clusterCIDR and keeps its source address.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Iterable

from cni.errors import ERR_KERNEL, CNIError

TABLE = "sluice"
MULTICAST = "224.0.0.0/4"


def set_name(network: str) -> str:
    return f"masq_{network}"


def _nft(script: str, what: str) -> subprocess.CompletedProcess[str]:
    nft = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
    if nft is None:
        raise CNIError(ERR_KERNEL, f"failed to {what}: the nft command is not installed")
    return subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True,
                          check=False)


def _setup(network: str, cluster: ipaddress.IPv4Network) -> str:
    name = set_name(network)
    return (
        f"add table ip {TABLE}\n"
        f"add set ip {TABLE} {name} {{ type ipv4_addr; }}\n"
        f"add chain ip {TABLE} {name} {{ type nat hook postrouting priority srcnat; "
        f'policy accept; comment "sluice network {network}"; }}\n'
        f"flush chain ip {TABLE} {name}\n"
        f"add rule ip {TABLE} {name} ip saddr @{name} "
        f"ip daddr != {{ {cluster}, {MULTICAST} }} masquerade\n"
    )


def add(network: str, cluster: ipaddress.IPv4Network, ips: Iterable[str]) -> None:
    elements = ", ".join(ips)
    script = _setup(network, cluster)
    script += f"add element ip {TABLE} {set_name(network)} {{ {elements} }}\n"
    proc = _nft(script, "set up masquerading")
    if proc.returncode != 0:
        raise CNIError(ERR_KERNEL, f"failed to masquerade {elements} for network "
                       f"{network!r}: {proc.stderr.strip()}")


def remove(network: str, ips: Iterable[str]) -> None:
    """Remove pod addresses from the set; absent ones (or no set at all) are fine."""
    for ip in ips:
        _nft(f"delete element ip {TABLE} {set_name(network)} {{ {ip} }}\n", "remove masquerading")


def contains(network: str, ip: str) -> bool:
    proc = _nft(f"get element ip {TABLE} {set_name(network)} {{ {ip} }}\n", "read masquerading")
    return proc.returncode == 0


def replace(network: str, cluster: ipaddress.IPv4Network, ips: Iterable[str]) -> None:
    """Make the set hold exactly ``ips`` (GC), in one transaction."""
    ips = list(ips)
    script = _setup(network, cluster) + f"flush set ip {TABLE} {set_name(network)}\n"
    if ips:
        script += f"add element ip {TABLE} {set_name(network)} {{ {', '.join(ips)} }}\n"
    proc = _nft(script, "resynchronise masquerading")
    if proc.returncode != 0:
        raise CNIError(ERR_KERNEL, f"failed to resynchronise masquerading for network "
                       f"{network!r}: {proc.stderr.strip()}")


def drop(network: str) -> None:
    """Remove the network's chain and set (GC with no attachment left)."""
    name = set_name(network)
    _nft(f"delete chain ip {TABLE} {name}\n", "remove masquerading")
    _nft(f"delete set ip {TABLE} {name}\n", "remove masquerading")
