"""Forgetting the kernel's connection tracking entries of an address.

When a pod goes, netfilter's conntrack may still hold entries for its address
(TIME_WAIT, NATed flows through Services); they must not apply to the next
pod that gets it. One ctnetlink delete request per direction and side asks
the kernel to flush every entry whose tuple has the address, filtered in the
kernel, so the table is never dumped to userspace.

The socket stays open for the process's life: closing a netfilter netlink
socket makes the kernel first finish nf_tables' deferred destruction, which
waits for an RCU grace period whenever a ruleset change (such as DEL's
masquerade removal) is pending.
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost a one-call process
import errno
import struct
import threading

NETLINK_NETFILTER = 12
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
NLA_F_NESTED = 0x8000
IPCTNL_MSG_CT_DELETE = (1 << 8) | 2  # ctnetlink subsystem, delete
AF_INET = 2
NFNETLINK_FILTERED = 1  # nfgenmsg version: flush only the family's entries

CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, CTA_FILTER = 1, 2, 25
CTA_TUPLE_IP = 1
CTA_IP_V4_SRC, CTA_IP_V4_DST = 1, 2
CTA_FILTER_ORIG_FLAGS, CTA_FILTER_REPLY_FLAGS = 1, 2
FILTER_IP_SRC, FILTER_IP_DST = 1 << 0, 1 << 1
HEADER = struct.Struct("=IHHII")


def _attr(kind: int, payload: bytes, nested: bool = False) -> bytes:
    length = 4 + len(payload)
    head = struct.pack("=HH", length, kind | (NLA_F_NESTED if nested else 0))
    return head + payload + b"\0" * ((4 - length % 4) % 4)


def _flush_request(ip: str, reply: bool, destination: bool, sequence: int) -> bytes:
    address = _attr(CTA_IP_V4_DST if destination else CTA_IP_V4_SRC, _socket.inet_aton(ip))
    tuple_ = _attr(CTA_TUPLE_IP, address, nested=True)
    flags = FILTER_IP_DST if destination else FILTER_IP_SRC
    filter_ = _attr(
        CTA_FILTER_REPLY_FLAGS if reply else CTA_FILTER_ORIG_FLAGS, struct.pack("=I", flags)
    )
    body = (
        struct.pack("=BBH", AF_INET, NFNETLINK_FILTERED, 0)
        + _attr(CTA_TUPLE_REPLY if reply else CTA_TUPLE_ORIG, tuple_, nested=True)
        + _attr(CTA_FILTER, filter_, nested=True)
    )
    return HEADER.pack(HEADER.size + len(body), IPCTNL_MSG_CT_DELETE,
                       NLM_F_REQUEST | NLM_F_ACK, sequence, 0) + body  # fmt: skip


class _Channel:
    """One ctnetlink socket, used by one thread at a time, reopened after an error."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: _socket.socket | None = None
        self.sequence = 0

    def flush(self, ips: list[str]) -> None:
        with self.lock:
            if self.sock is None:
                sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC,
                                     NETLINK_NETFILTER)  # fmt: skip
                sock.bind((0, 0))
                self.sock = sock
            try:
                for ip in ips:
                    for reply in (False, True):
                        for destination in (False, True):
                            self.sequence = self.sequence % 0xFFFFFFFF + 1
                            self.sock.send(_flush_request(ip, reply, destination, self.sequence))
                            _expect_ack(self.sock, self.sequence)
            except OSError:
                self.sock.close()  # its state is unknown: the next call opens another
                self.sock = None
                raise


_channel = _Channel()


def forget(ips: list[str]) -> None:
    """Delete every conntrack entry whose original or reply tuple has one of ``ips``
    as source or destination. Best effort: errors other than "none found" raise OSError."""
    if ips:
        _channel.flush(ips)


def _expect_ack(sock: _socket.socket, sequence: int) -> None:
    while True:
        data = sock.recv(65536)
        offset = 0
        while offset + HEADER.size <= len(data):
            length, kind, _, seq, _ = HEADER.unpack_from(data, offset)
            if kind == NLMSG_ERROR and seq == sequence:
                (code,) = struct.unpack_from("=i", data, offset + HEADER.size)
                if code not in (0, -errno.ENOENT):
                    raise OSError(
                        -code, f"failed to flush conntrack entries: {errno.errorcode.get(-code)}"
                    )
                return
            offset += max(HEADER.size, (length + 3) & ~3)
