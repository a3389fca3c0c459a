"""A synchronous rtnetlink socket for the messages sluice sends, packed by hand.

Every message an ADD or a DEL sends is packed here (``cni.net.rtmsg``), sent
on a plain netlink socket, and answered by a request's acknowledgement or a
dump; the few that only CHECK, GC and sluicectl send go the same way, so
there is one way to speak netlink and one error class (``NetlinkError``).

pyroute2's API was measured against it for each of those messages, in one
warm process as in the agent (``IPRoute`` 0.9.7, 30 interleaved ADD/DEL
pairs on a 2-CPU VM, median ms, idle / loaded by other work; each method's
figures are beside it as "pyroute2 X, here Y", from the idle run but for
the tc messages, from the loaded one):

    ADD, 17 messages and 2 sockets   pyroute2 15.3 / 36.6   here 2.5 / 2.9
    DEL, 4 messages and 2 sockets    pyroute2 30.0 / 39.1   here 22.0 / 23.9
                                     (20.7 / 21.2 of which the kernel's veth deletion)

Each message costs pyroute2 0.4 to 1.9 ms more (its sockets run on an
asyncio core, and each request goes through it), a socket 0.8 to 1.3 ms
more: no single message of an ADD stays within the 1 ms an ADD may spend on
the library. In a process that lives for one call (the plugin without an
agent) importing pyroute2 costs another 0.26 to 0.41 s and 32 MB, since the
package's ``__init__`` loads every subsystem it has. So nothing of sluice
imports pyroute2.
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost a one-call process
import errno
import os
import struct

from cni.net import rtmsg
from cni.net.rtmsg import Message, asciiz, attr, attrs, ipv4, mac, u32

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni.net.netns import Netns

__all__ = ["NetlinkError", "Rtnl"]


class NetlinkError(Exception):
    """The kernel refused a request: ``code`` is its errno, ``args`` (code, message)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(code, message or os.strerror(code))
        self.code = code


NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_EXT_ACK = 11
NETLINK_GET_STRICT_CHK = 12

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_DUMP = 0x300
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200
NLMSG_ERROR = 2
NLMSG_DONE = 3
HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
RTM_NEWNEIGH, RTM_GETNEIGH = 28, 30
RTM_NEWQDISC, RTM_DELQDISC = 36, 37
RTM_NEWTFILTER, RTM_DELTFILTER, RTM_GETTFILTER = 44, 45, 46
# What an answer of each type is: its fixed header, the header's fields, its attributes.
ANSWERS = {
    RTM_NEWLINK: (rtmsg.IFINFMSG, rtmsg.IFINFMSG_FIELDS, rtmsg.LINK_ATTRS),
    RTM_NEWADDR: (rtmsg.IFADDRMSG, rtmsg.IFADDRMSG_FIELDS, rtmsg.ADDRESS_ATTRS),
    RTM_NEWROUTE: (rtmsg.RTMSG, rtmsg.RTMSG_FIELDS, rtmsg.ROUTE_ATTRS),
    RTM_NEWNEIGH: (rtmsg.NDMSG, rtmsg.NDMSG_FIELDS, rtmsg.NEIGHBOR_ATTRS),
    RTM_NEWTFILTER: (rtmsg.TCMSG, rtmsg.TCMSG_FIELDS, rtmsg.TC_ATTRS),
}

# Attribute types (linux/if_link.h, if_addr.h, rtnetlink.h, neighbour.h, veth.h).
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_IFALIAS = 1, 3, 4, 18, 20
IFLA_NET_NS_FD = 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
NDA_DST, NDA_LLADDR, NDA_IFINDEX = 1, 2, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_METRICS, RTA_TABLE = 1, 4, 5, 6, 8, 15
RTAX = {"RTAX_MTU": 2, "RTAX_ADVMSS": 8}
# linux/pkt_sched.h, pkt_cls.h: the clsact qdisc and direct-action bpf filters.
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_CLASSID, TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS = 3, 6, 7, 8
TCA_BPF_FLAG_ACT_DIRECT = 1
TC_H_CLSACT = 0xFFFFFFF1  # also the parent of clsact's ingress (…2) and egress (…3) hooks
CLSACT_HANDLE = 0xFFFF0000
ETH_P_ALL = 0x0003
NLM_F_REPLACE = 0x100

AF_INET = 2
IFF_UP = 0x1
RT_TABLE_MAIN = 254
RT_TABLE_LOCAL = 255
RTPROT_BOOT = 3
RTN_UNICAST = 1
RT_SCOPE_UNIVERSE = 0
RECEIVE_BUFFER = 1 << 20


class Rtnl:
    """An rtnetlink socket in the namespace the calling thread is in when it opens."""

    def __init__(self, netns: Netns | None = None) -> None:
        # pyroute2 1.3 (in a pod's namespace) and 0.9 (the node's), here 0.05 and 0.01
        self.netns = netns  # the pod's namespace it was opened in, None for the node's
        self.sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, 0)
        try:
            self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            # Dumps filtered by the kernel (index, table, output interface).
            self.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self.sock.bind((0, 0))
        except BaseException:
            self.sock.close()
            raise
        self.sequence = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the transport ------------------------------------------------------------

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[Message]:
        """Send one message (``body``: what follows the nlmsghdr); return the answers
        (a dump's, or an echo), or raise the kernel's error as NetlinkError."""
        self.sequence += 1
        header = HEADER.pack(
            HEADER.size + len(body), msg_type, NLM_F_REQUEST | flags, self.sequence, 0
        )
        self.sock.send(header + body)
        return self._answers(flags & NLM_F_DUMP == NLM_F_DUMP)

    def _answers(self, dump: bool) -> list[Message]:
        answers: list[Message] = []
        while True:
            data = self.sock.recv(RECEIVE_BUFFER)
            offset = 0
            while offset + HEADER.size <= len(data):
                length, msg_type, _, sequence, _ = HEADER.unpack_from(data, offset)
                if length < HEADER.size:
                    raise NetlinkError(errno.EBADMSG, "truncated netlink message")
                chunk = data[offset : offset + length]
                offset += (length + 3) & ~3
                if sequence != self.sequence:
                    continue  # a late answer to an earlier request
                if msg_type == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", chunk, HEADER.size)
                    if code:
                        raise NetlinkError(-code, _ext_ack_message(chunk) or None)
                    return answers
                if msg_type == NLMSG_DONE:
                    return answers
                answer = ANSWERS.get(msg_type)
                if answer is not None:
                    answers.append(rtmsg.decode(chunk[HEADER.size :], *answer))
                if not dump:
                    return answers

    def _ack(self, msg_type: int, body: bytes, flags: int = 0) -> None:
        self.request(msg_type, body, flags | NLM_F_ACK)

    # -- links ------------------------------------------------------------------------

    def get_link(self, name: str | None = None, index: int = 0) -> Message:
        # pyroute2 0.7-1.0, here 0.08-0.20
        body = _ifinfmsg(index)
        if name is not None:
            body += attr(IFLA_IFNAME, asciiz(name))
        (answer,) = self.request(RTM_GETLINK, body)
        return answer

    def dump_links(self) -> list[Message]:
        return self.request(RTM_GETLINK, _ifinfmsg(), NLM_F_DUMP)

    def add_veth(
        self,
        name: str,
        mac_address: str,
        mtu: int,
        peer_name: str,
        peer_netns_fd: int,
        peer_mac: str | None,
    ) -> None:
        """A veth pair, its peer created directly inside another namespace (pyroute2
        2.1, here 0.9)."""
        peer = _ifinfmsg() + attrs(
            [
                (IFLA_IFNAME, asciiz(peer_name)),
                (IFLA_NET_NS_FD, u32(peer_netns_fd)),
                (IFLA_MTU, u32(mtu)),
                *([(IFLA_ADDRESS, mac(peer_mac))] if peer_mac else []),
            ]
        )
        linkinfo = attr(IFLA_INFO_KIND, asciiz("veth")) + attr(
            IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer)
        )
        body = _ifinfmsg() + attrs(
            [
                (IFLA_IFNAME, asciiz(name)),
                (IFLA_ADDRESS, mac(mac_address)),
                (IFLA_MTU, u32(mtu)),
                (IFLA_LINKINFO, linkinfo),
            ]
        )
        self._ack(RTM_NEWLINK, body, NLM_F_CREATE | NLM_F_EXCL)

    def set_link(self, index: int, *, up: bool | None = None, alias: str | None = None) -> None:
        # pyroute2 0.5 (up, alias) and 1.6 (down), here 0.06-0.10 and 1.0
        flags = change = 0
        if up is not None:
            flags = IFF_UP if up else 0
            change = IFF_UP
        body = _ifinfmsg(index, flags, change)
        if alias is not None:
            body += attr(IFLA_IFALIAS, asciiz(alias))
        self._ack(RTM_NEWLINK, body)

    def delete_link(self, name: str | None = None, index: int = 0) -> None:
        # pyroute2 24.6, here 20.7: the kernel's wait for the veth's RCU callbacks
        body = _ifinfmsg(index)
        if name is not None:
            body += attr(IFLA_IFNAME, asciiz(name))
        self._ack(RTM_DELLINK, body)

    # -- addresses and neighbours --------------------------------------------------------

    def add_address(self, index: int, address: str, prefixlen: int, flags: int) -> None:
        # pyroute2 0.70, here 0.12
        body = rtmsg.IFADDRMSG.pack(AF_INET, prefixlen, 0, 0, index) + attrs(
            [(IFA_LOCAL, ipv4(address)), (IFA_ADDRESS, ipv4(address)), (IFA_FLAGS, u32(flags))]
        )
        self._ack(RTM_NEWADDR, body, NLM_F_CREATE | NLM_F_EXCL)

    def dump_addresses(self, index: int) -> list[Message]:
        body = rtmsg.IFADDRMSG.pack(AF_INET, 0, 0, 0, index)
        return [a for a in self.request(RTM_GETADDR, body, NLM_F_DUMP) if a["index"] == index]

    def add_neighbor(self, index: int, ip: str, mac_address: str, state: int) -> None:
        # pyroute2 0.53, here 0.07
        body = rtmsg.NDMSG.pack(AF_INET, index, state, 0, 0) + attrs(
            [(NDA_DST, ipv4(ip)), (NDA_LLADDR, mac(mac_address))]
        )
        self._ack(RTM_NEWNEIGH, body, NLM_F_CREATE | NLM_F_EXCL)

    def dump_neighbors(self, index: int) -> list[Message]:
        # NDA_IFINDEX: the strict dump filter
        body = rtmsg.NDMSG.pack(AF_INET, 0, 0, 0, 0) + attr(NDA_IFINDEX, u32(index))
        answers = self.request(RTM_GETNEIGH, body, NLM_F_DUMP)
        return [n for n in answers if n["ifindex"] == index]

    # -- routes ----------------------------------------------------------------------------

    def add_route(
        self,
        dst: str,
        dst_len: int,
        oif: int,
        *,
        gateway: str = "",
        scope: int = RT_SCOPE_UNIVERSE,
        table: int = RT_TABLE_MAIN,
        priority: int = 0,
        metrics: dict[str, int] | None = None,
    ) -> None:
        # pyroute2 0.65-0.73, here 0.07-0.12
        header = rtmsg.RTMSG.pack(
            AF_INET,
            dst_len,
            0,
            0,
            table if table < 256 else 252,  # RT_TABLE_COMPAT, the id goes in RTA_TABLE
            RTPROT_BOOT,
            scope,
            RTN_UNICAST,
            0,
        )
        pairs = [(RTA_DST, ipv4(dst)), (RTA_OIF, u32(oif)), (RTA_TABLE, u32(table))]
        if gateway:
            pairs.append((RTA_GATEWAY, ipv4(gateway)))
        if priority:
            pairs.append((RTA_PRIORITY, u32(priority)))
        if metrics:
            pairs.append((RTA_METRICS, attrs((RTAX[k], u32(v)) for k, v in metrics.items())))
        self._ack(RTM_NEWROUTE, header + attrs(pairs), NLM_F_CREATE | NLM_F_EXCL)

    def dump_routes(self, oif: int) -> list[Message]:
        """IPv4 routes through ``oif``, in every table but the kernel's local one, the
        kernel filtering the dump (pyroute2 2.1, here 0.15)."""
        body = _rtmsg() + attr(RTA_OIF, u32(oif))
        return [
            r
            for r in self.request(RTM_GETROUTE, body, NLM_F_DUMP)
            if r.get("RTA_OIF") == oif and (r.get("RTA_TABLE") or r["table"]) != RT_TABLE_LOCAL
        ]

    def get_route(self, dst: str) -> Message:
        """The route the node would use for ``dst`` (a lookup, not a dump; with the
        link lookup after it, pyroute2 2.0, here 0.28)."""
        (answer,) = self.request(RTM_GETROUTE, _rtmsg(dst_len=32) + attr(RTA_DST, ipv4(dst)))
        return answer

    # -- clsact and bpf filters ("attach": "tc", and kernels without tcx) ---------------------

    def add_clsact(self, index: int) -> None:
        # pyroute2 1.7, here 0.14 (loaded run)
        self._ack(RTM_NEWQDISC, _clsact(index), NLM_F_CREATE | NLM_F_EXCL)

    def delete_clsact(self, index: int) -> None:
        self._ack(RTM_DELQDISC, _clsact(index))

    def set_bpf_filter(
        self, index: int, parent: int, handle: int, prio: int, fd: int, name: str, *, replace: bool
    ) -> None:
        """A direct-action bpf filter running the program ``fd`` on a clsact hook; with
        ``replace`` the one of this handle and priority takes the new program (pyroute2
        2.1, here 0.08, loaded run)."""
        options = attrs(
            [
                (TCA_BPF_FD, u32(fd)),
                (TCA_BPF_NAME, asciiz(name)),
                (TCA_BPF_FLAGS, u32(TCA_BPF_FLAG_ACT_DIRECT)),
                (TCA_BPF_CLASSID, u32(1)),
            ]
        )
        body = _tcmsg(index, handle, parent, prio) + attrs(
            [(TCA_KIND, asciiz("bpf")), (TCA_OPTIONS, options)]
        )
        self._ack(RTM_NEWTFILTER, body, NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL))

    def delete_bpf_filter(self, index: int, parent: int, handle: int, prio: int) -> None:
        body = _tcmsg(index, handle, parent, prio) + attr(TCA_KIND, asciiz("bpf"))
        self._ack(RTM_DELTFILTER, body)

    def bpf_filters(self, index: int, parent: int) -> list[Message]:
        """The bpf filters on a clsact hook (``TCA_OPTIONS``: name and program id)."""
        body = rtmsg.TCMSG.pack(0, index, 0, parent, 0)
        answers = self.request(RTM_GETTFILTER, body, NLM_F_DUMP)
        return [f for f in answers if f["index"] == index and f.get("TCA_KIND") == "bpf"]


def _ifinfmsg(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return rtmsg.IFINFMSG.pack(0, 0, index, flags, change)  # AF_UNSPEC


def _clsact(index: int) -> bytes:
    return rtmsg.TCMSG.pack(0, index, CLSACT_HANDLE, TC_H_CLSACT, 0) + attr(
        TCA_KIND, asciiz("clsact")
    )


def _tcmsg(index: int, handle: int, parent: int, prio: int) -> bytes:
    """A filter's header: tcm_info holds its priority and protocol (all, in network order)."""
    protocol = _socket.htons(ETH_P_ALL)
    return rtmsg.TCMSG.pack(0, index, handle, parent, (prio << 16) | protocol)


def _rtmsg(dst_len: int = 0) -> bytes:
    return rtmsg.RTMSG.pack(AF_INET, dst_len, 0, 0, 0, 0, 0, 0, 0)


def _ext_ack_message(chunk: bytes) -> str:
    """The kernel's extended-ack text (NLMSGERR_ATTR_MSG), if it sent one."""
    # nlmsgerr: the error code, the offending request (only its header when the
    # kernel set NLM_F_CAPPED), then the TLVs when NLM_F_ACK_TLVS is set.
    _, _, flags, _, _ = HEADER.unpack_from(chunk, 0)
    if not flags & NLM_F_ACK_TLVS:
        return ""
    (echoed,) = struct.unpack_from("=I", chunk, HEADER.size + 4)
    offset = HEADER.size + 4 + (HEADER.size if flags & NLM_F_CAPPED else (echoed + 3) & ~3)
    while offset + 4 <= len(chunk):
        length, kind = struct.unpack_from("=HH", chunk, offset)
        if length < 4:
            break
        if kind & 0x3FFF == 1:  # NLMSGERR_ATTR_MSG
            return chunk[offset + 4 : offset + length].split(b"\0", 1)[0].decode(errors="replace")
        offset += (length + 3) & ~3
    return ""
