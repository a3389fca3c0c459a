"""Addresses and static neighbour entries on a link."""

from __future__ import annotations

import ipaddress

from cni.net.netlink import IPRoute, kernel_op

# IFA_F_NOPREFIXROUTE: keep the address's prefix length without the kernel's
# on-link route for the whole subnet, since every pod reaches every other
# address through its gateway.
IFA_F_NOPREFIXROUTE = 0x200
NUD_PERMANENT = 0x80


def add_address(ipr: IPRoute, index: int, ifname: str, cidr: str) -> None:
    iface = ipaddress.ip_interface(cidr)
    with kernel_op(f'add address {cidr} to "{ifname}"'):
        ipr.addr(
            "add",
            index=index,
            address=str(iface.ip),
            prefixlen=iface.network.prefixlen,
            IFA_FLAGS=IFA_F_NOPREFIXROUTE,
        )


def addresses(ipr: IPRoute, index: int) -> set[str]:
    """The link's addresses in CIDR form."""
    return {f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}" for msg in ipr.addr("dump", index=index)}


def add_permanent_neighbor(ipr: IPRoute, index: int, ifname: str, ip: str, mac: str) -> None:
    with kernel_op(f'add neighbour {ip} lladdr {mac} on "{ifname}"'):
        ipr.neigh("add", dst=ip, lladdr=mac, ifindex=index, state=NUD_PERMANENT)


def permanent_neighbors(ipr: IPRoute, index: int) -> dict[str, str]:
    return {
        msg.get("NDA_DST"): msg.get("NDA_LLADDR")
        for msg in ipr.neigh("dump", ifindex=index)
        if msg["state"] & NUD_PERMANENT
    }
