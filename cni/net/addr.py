"""Addresses and static neighbour entries on a link."""

from __future__ import annotations

import ipaddress

from cni.net.netlink import Rtnl, kernel_op

# IFA_F_NOPREFIXROUTE: keep the address's prefix length without the kernel's
# on-link route for the whole subnet, since every pod reaches every other
# address through its gateway.
IFA_F_NOPREFIXROUTE = 0x200
NUD_PERMANENT = 0x80


def add_address(rtnl: Rtnl, index: int, ifname: str, cidr: str) -> None:
    iface = ipaddress.ip_interface(cidr)
    with kernel_op(f'add address {cidr} to "{ifname}"'):
        rtnl.add_address(index, str(iface.ip), iface.network.prefixlen, IFA_F_NOPREFIXROUTE)


def addresses(rtnl: Rtnl, index: int) -> set[str]:
    """The link's IPv4 addresses in CIDR form."""
    return {f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}" for msg in rtnl.dump_addresses(index)}


def add_permanent_neighbor(rtnl: Rtnl, index: int, ifname: str, ip: str, mac: str) -> None:
    with kernel_op(f'add neighbour {ip} lladdr {mac} on "{ifname}"'):
        rtnl.add_neighbor(index, ip, mac, NUD_PERMANENT)


def permanent_neighbors(rtnl: Rtnl, index: int) -> dict[str, str]:
    return {
        msg.get("NDA_DST"): msg.get("NDA_LLADDR")
        for msg in rtnl.dump_neighbors(index)
        if msg["state"] & NUD_PERMANENT
    }
