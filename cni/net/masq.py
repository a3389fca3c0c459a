"""ipMasq: masquerade pod traffic that leaves the cluster range (nftables).

Each network has its own table, ``ip sluice_<network>``, holding the set of
its pod addresses and one postrouting chain:

    ip saddr @pods ip daddr != { <clusterCIDR>, 224.0.0.0/4 } masquerade

ADD adds the pod's address to the set, creating table, set and chain in the
same transaction, so concurrent ADDs are safe; DEL removes it and drops the
table with the network's last pod; GC rebuilds the set, or drops the table
when no pod is left. Pod-to-pod traffic stays inside clusterCIDR and keeps its
source address.

Dropping the table is a read (is the set empty?) then a write, which nft cannot
do in one transaction: an ADD between the two would lose its element with the
table. So every change takes a flock of the network's file under ``LOCK_DIR``:
ADDs share it (each is one transaction), DEL and GC hold it alone. The
directory is the node's (the DaemonSet mounts /run/sluice), so the agent and an
in-process call of the plugin take the same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
from collections.abc import Iterable, Iterator

from cni.net import nftables
from cni.spec.errors import ERR_KERNEL, CNIError

TABLE_PREFIX = "sluice_"
SET = "pods"
CHAIN = "postrouting"
MULTICAST = "224.0.0.0/4"
LOCK_DIR = "/run/sluice/masq"


def table_name(network: str) -> str:
    return f"{TABLE_PREFIX}{network}"


@contextlib.contextmanager
def _locked(network: str, mode: int) -> Iterator[None]:
    """The network's masquerade lock: ``fcntl.LOCK_SH`` for ADDs, ``LOCK_EX`` for
    changes that may drop the table."""
    try:
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        fd = os.open(
            os.path.join(LOCK_DIR, f"{network}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
    except OSError as err:
        raise CNIError(
            ERR_KERNEL, f"failed to lock the masquerading of network {network!r}: {err}"
        ) from None
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


def _nft(script: str, what: str) -> int:
    try:
        rc, _ = nftables.run(script)
    except FileNotFoundError as err:
        raise CNIError(ERR_KERNEL, f"failed to {what}: {err}") from None
    return rc


def _apply(script: str, what: str) -> None:
    try:
        rc, error = nftables.run(script)
    except FileNotFoundError as err:
        raise CNIError(ERR_KERNEL, f"failed to {what}: {err}") from None
    if rc != 0:
        raise CNIError(ERR_KERNEL, f"failed to {what}: {error}")


def _setup(network: str, cluster: ipaddress.IPv4Network) -> str:
    table = table_name(network)
    return (
        f"add table ip {table}\n"
        f"add set ip {table} {SET} {{ type ipv4_addr; }}\n"
        f"add chain ip {table} {CHAIN} {{ type nat hook postrouting priority srcnat; "
        "policy accept; }\n"
        f"flush chain ip {table} {CHAIN}\n"
        f"add rule ip {table} {CHAIN} ip saddr @{SET} "
        f"ip daddr != {{ {cluster}, {MULTICAST} }} masquerade\n"
    )


def add(network: str, cluster: ipaddress.IPv4Network, ips: Iterable[str]) -> None:
    elements = ", ".join(ips)
    script = _setup(network, cluster)
    script += f"add element ip {table_name(network)} {SET} {{ {elements} }}\n"
    with _locked(network, fcntl.LOCK_SH):
        _apply(script, f"masquerade {elements} for network {network!r}")


def remove(network: str, ips: Iterable[str]) -> None:
    """Remove pod addresses from the set, and the table once the set is empty (the
    network's last pod); absent addresses (or no table at all) are fine.

    One nft run for all of them; only if that fails (one was absent, which
    fails the whole transaction) is each tried on its own.
    """
    ips = list(ips)
    if not ips:
        return
    table = table_name(network)
    with _locked(network, fcntl.LOCK_EX):
        rc = _nft(
            f"delete element ip {table} {SET} {{ {', '.join(ips)} }}\n", "remove masquerading"
        )
        if rc != 0 and len(ips) > 1:
            for ip in ips:
                _nft(f"delete element ip {table} {SET} {{ {ip} }}\n", "remove masquerading")
        if _set_is_empty(table):
            _nft(f"delete table ip {table}\n", "remove masquerading")


def _set_is_empty(table: str) -> bool:
    """The table exists and its set holds no address (False when there is no table)."""
    try:
        rc, listing, _ = nftables.query(f"list set ip {table} {SET}\n")
    except FileNotFoundError as err:
        raise CNIError(ERR_KERNEL, f"failed to read masquerading: {err}") from None
    return rc == 0 and "elements = " not in listing


def contains(network: str, ip: str) -> bool:
    return (
        _nft(f"get element ip {table_name(network)} {SET} {{ {ip} }}\n", "read masquerading") == 0
    )


def replace(network: str, cluster: ipaddress.IPv4Network | None, ips: Iterable[str]) -> None:
    """Make the set hold exactly ``ips`` (GC), in one transaction; with ``cluster``
    the table and chain are (re)created too, else they must exist."""
    ips = list(ips)
    table = table_name(network)
    script = _setup(network, cluster) if cluster is not None else ""
    script += f"flush set ip {table} {SET}\n"
    if ips:
        script += f"add element ip {table} {SET} {{ {', '.join(ips)} }}\n"
    with _locked(network, fcntl.LOCK_EX):
        _apply(script, f"resynchronise masquerading for network {network!r}")


def drop(network: str) -> None:
    """Remove the network's table (GC with no attachment left); absent is fine."""
    with _locked(network, fcntl.LOCK_EX):
        _nft(f"delete table ip {table_name(network)}\n", "remove masquerading")
