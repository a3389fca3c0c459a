"""A synchronous rtnetlink socket with pyroute2's message classes.

pyroute2's ``IPRoute`` runs on an asyncio core, and importing the package
loads every subsystem it has (NDB, IPDB, conntrack, ethtool, nftables…):
about a quarter of a second for a process that lives for one CNI call. The
messages themselves (ifinfmsg, ifaddrmsg, rtmsg, ndmsg) encode and decode
without any of that, so this module sends them on a plain netlink socket and
waits for the answer: a request and its acknowledgement, or a dump.

``Rtnl`` has the few typed operations sluice's wiring needs. Any other
attribute (``link``, ``tc`` for the clsact fallback, ``get_filters``…) is
pyroute2's ``IPRoute`` API, served by a full IPRoute opened on first use in
the same namespace.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import socket
import struct
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cni.net.netns import Netns


def _import_messages_only() -> None:
    """Register the pyroute2 package without running its ``__init__`` (which imports
    every subsystem), unless something has imported it already. The first use of
    a name from the package itself (``from pyroute2 import IPRoute``) runs the
    ``__init__`` after all, so other code sees the package it expects."""
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError("pyroute2 is not installed")
    package = types.ModuleType("pyroute2")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__loader__ = spec.loader

    def complete(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"pyroute2.{name}") is not None:
            return importlib.import_module(f"pyroute2.{name}")  # a submodule
        del package.__getattr__  # type: ignore[attr-defined]
        spec.loader.exec_module(package)  # type: ignore[union-attr]
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[attr-defined]
    sys.modules["pyroute2"] = package


_import_messages_only()

from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # noqa: E402
from pyroute2.netlink.rtnl.ndmsg import ndmsg  # noqa: E402
from pyroute2.netlink.rtnl.rtmsg import rtmsg  # noqa: E402

__all__ = ["NetlinkError", "Rtnl"]

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
ANSWER_CLASSES: dict[int, Any] = {
    RTM_NEWLINK: ifinfmsg,
    RTM_NEWADDR: ifaddrmsg,
    RTM_NEWROUTE: rtmsg,
    RTM_NEWNEIGH: ndmsg,
}

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
        self.netns = netns  # where the fallback IPRoute must be opened, if not the node
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
        try:
            self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            # Dumps filtered by the kernel (index, table, output interface).
            self.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self.sock.bind((0, 0))
        except BaseException:
            self.sock.close()
            raise
        self.sequence = 0
        self._full: Any = None

    def close(self) -> None:
        self.sock.close()
        if self._full is not None:
            self._full.close()
            self._full = None

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the transport ------------------------------------------------------------

    def request(self, msg: Any, msg_type: int, flags: int = 0) -> list[Any]:
        """Send one message; return the answers (a dump's, or an echo), or raise the
        kernel's error as NetlinkError."""
        self.sequence += 1
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = NLM_F_REQUEST | flags
        msg["header"]["sequence_number"] = self.sequence
        msg["header"]["pid"] = 0
        msg.encode()
        self.sock.send(msg.data)
        return self._answers(flags & NLM_F_DUMP == NLM_F_DUMP)

    def _answers(self, dump: bool) -> list[Any]:
        answers: list[Any] = []
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
                answer_class = ANSWER_CLASSES.get(msg_type)
                if answer_class is not None:
                    answer = answer_class(chunk)
                    answer.decode()
                    answers.append(answer)
                if not dump:
                    return answers

    def _ack(self, msg: Any, msg_type: int, flags: int = 0) -> None:
        self.request(msg, msg_type, flags | NLM_F_ACK)

    # -- links ------------------------------------------------------------------------

    def get_link(self, name: str | None = None, index: int = 0) -> Any:
        msg = ifinfmsg()
        msg["index"] = index
        if name is not None:
            msg["attrs"] = [["IFLA_IFNAME", name]]
        (answer,) = self.request(msg, RTM_GETLINK)
        return answer

    def dump_links(self) -> list[Any]:
        return self.request(ifinfmsg(), RTM_GETLINK, NLM_F_DUMP)

    def add_veth(
        self,
        name: str,
        mac: str,
        mtu: int,
        peer_name: str,
        peer_netns_fd: int,
        peer_mac: str | None,
    ) -> None:
        """A veth pair, its peer created directly inside another namespace."""
        peer_attrs: list[list[Any]] = [
            ["IFLA_IFNAME", peer_name],
            ["IFLA_NET_NS_FD", peer_netns_fd],
            ["IFLA_MTU", mtu],
        ]
        if peer_mac:
            peer_attrs.append(["IFLA_ADDRESS", peer_mac])
        peer = {"attrs": peer_attrs}
        msg = ifinfmsg()
        msg["attrs"] = [
            ["IFLA_IFNAME", name],
            ["IFLA_ADDRESS", mac],
            ["IFLA_MTU", mtu],
            [
                "IFLA_LINKINFO",
                {
                    "attrs": [
                        ["IFLA_INFO_KIND", "veth"],
                        ["IFLA_INFO_DATA", {"attrs": [["VETH_INFO_PEER", peer]]}],
                    ]
                },
            ],
        ]
        self._ack(msg, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL)

    def set_link(self, index: int, *, up: bool | None = None, alias: str | None = None) -> None:
        msg = ifinfmsg()
        msg["index"] = index
        if up is not None:
            msg["flags"] = IFF_UP if up else 0
            msg["change"] = IFF_UP
        if alias is not None:
            msg["attrs"] = [["IFLA_IFALIAS", alias]]
        self._ack(msg, RTM_NEWLINK)

    def delete_link(self, name: str | None = None, index: int = 0) -> None:
        msg = ifinfmsg()
        if name is not None:
            msg["attrs"] = [["IFLA_IFNAME", name]]
        msg["index"] = index
        self._ack(msg, RTM_DELLINK)

    # -- addresses and neighbours --------------------------------------------------------

    def add_address(self, index: int, address: str, prefixlen: int, flags: int) -> None:
        msg = ifaddrmsg()
        msg["family"] = AF_INET
        msg["prefixlen"] = prefixlen
        msg["index"] = index
        msg["attrs"] = [
            ["IFA_LOCAL", address],
            ["IFA_ADDRESS", address],
            ["IFA_FLAGS", flags],
        ]
        self._ack(msg, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL)

    def dump_addresses(self, index: int) -> list[Any]:
        msg = ifaddrmsg()
        msg["family"] = AF_INET
        msg["index"] = index
        return [a for a in self.request(msg, RTM_GETADDR, NLM_F_DUMP) if a["index"] == index]

    def add_neighbor(self, index: int, ip: str, mac: str, state: int) -> None:
        msg = ndmsg()
        msg["family"] = AF_INET
        msg["ifindex"] = index
        msg["state"] = state
        msg["attrs"] = [["NDA_DST", ip], ["NDA_LLADDR", mac]]
        self._ack(msg, RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_EXCL)

    def dump_neighbors(self, index: int) -> list[Any]:
        msg = ndmsg()
        msg["family"] = AF_INET
        msg["attrs"] = [["NDA_IFINDEX", index]]  # the strict dump filter
        answers = self.request(msg, RTM_GETNEIGH, NLM_F_DUMP)
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
        msg = rtmsg()
        msg["family"] = AF_INET
        msg["dst_len"] = dst_len
        msg["table"] = table if table < 256 else 252  # RT_TABLE_COMPAT, the id goes in RTA_TABLE
        msg["proto"] = RTPROT_BOOT
        msg["scope"] = scope
        msg["type"] = RTN_UNICAST
        attrs: list[list[Any]] = [["RTA_DST", dst], ["RTA_OIF", oif], ["RTA_TABLE", table]]
        if gateway:
            attrs.append(["RTA_GATEWAY", gateway])
        if priority:
            attrs.append(["RTA_PRIORITY", priority])
        if metrics:
            attrs.append(["RTA_METRICS", {"attrs": [[k, v] for k, v in metrics.items()]}])
        msg["attrs"] = attrs
        self._ack(msg, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL)

    def dump_routes(self, oif: int) -> list[Any]:
        """IPv4 routes through ``oif``, in every table but the kernel's local one."""
        msg = rtmsg()
        msg["family"] = AF_INET
        msg["attrs"] = [["RTA_OIF", oif]]
        return [
            r
            for r in self.request(msg, RTM_GETROUTE, NLM_F_DUMP)
            if r.get("RTA_OIF") == oif and (r.get("RTA_TABLE") or r["table"]) != RT_TABLE_LOCAL
        ]

    def get_route(self, dst: str) -> Any:
        """The route the node would use for ``dst`` (a lookup, not a dump)."""
        msg = rtmsg()
        msg["family"] = AF_INET
        msg["dst_len"] = 32
        msg["attrs"] = [["RTA_DST", dst]]
        (answer,) = self.request(msg, RTM_GETROUTE)
        return answer

    # -- everything else: a full pyroute2 IPRoute ------------------------------------------

    def full(self) -> Any:
        """pyroute2's IPRoute in this socket's namespace (imports all of pyroute2)."""
        if self._full is None:
            from pyroute2.iproute.linux import IPRoute

            if self.netns is None:
                self._full = IPRoute()
            else:
                with self.netns.entered():
                    self._full = IPRoute()
        return self._full

    def __getattr__(self, name: str) -> Any:
        """``link``, ``route``, ``tc``, ``get_filters``…: pyroute2's IPRoute API."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full(), name)


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
