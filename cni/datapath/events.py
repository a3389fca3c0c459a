"""Reading the datapath's deny events from its BPF ring buffer, without bcc.

The ring buffer is mapped as the kernel lays it out: one read-write page
holding the consumer position, then a read-only page holding the producer
position followed by the data area, mapped twice in a row so that a record
that wraps around can be read in one piece.

A record is ``struct sl_event`` and the frame's EtherType
(``struct sl_event_record``, bpf/verdict.h): a drop of a frame that is not
IPv4 (IPv6, ARP, a VLAN tag) carries no addresses or ports, only that.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from cni.datapath import bpf
from cni.datapath.structs import DIRECTIONS, REASONS, Event, ip_str, port_host

BUSY = 1 << 31
DISCARD = 1 << 30
HEADER = 8
PROTOCOL_NAMES = {0: "-", 1: "icmp", 6: "tcp", 17: "udp", 132: "sctp"}
ETH_P_IP = 0x0800
ETHERTYPE_NAMES = {
    ETH_P_IP: "IPv4",
    0x0806: "ARP",
    0x8035: "RARP",
    0x86DD: "IPv6",
    0x8100: "VLAN",
    0x88A8: "QinQ",
    0x8863: "PPPoE-discovery",
    0x8864: "PPPoE",
    0x8847: "MPLS",
    0x88CC: "LLDP",
    0x88E5: "MACsec",
}


class EventRecord(ctypes.Structure):
    """``struct sl_event_record`` of bpf/verdict.h."""

    _fields_ = [("ev", Event), ("ethertype", ctypes.c_uint16), ("pad", ctypes.c_uint16 * 3)]


def ethertype_name(ethertype: int) -> str:
    """ "IPv6 (0x86dd)"; the number alone for a type without a name here."""
    name = ETHERTYPE_NAMES.get(ethertype)
    return f"{name} (0x{ethertype:04x})" if name else f"0x{ethertype:04x}"


@dataclass(frozen=True)
class DenyEvent:
    timestamp_ns: int
    ifindex: int
    direction: str
    reason: str
    protocol: str
    source: str
    destination: str
    sport: int
    dport: int
    ethertype: int = ETH_P_IP  # of the frame; only an IPv4 packet has the fields above

    @property
    def ipv4(self) -> bool:
        return self.ethertype == ETH_P_IP

    @classmethod
    def decode(cls, raw: bytes) -> DenyEvent:
        ev = Event.from_buffer_copy(raw[: ctypes.sizeof(Event)])
        ethertype = ETH_P_IP  # a record of programs older than the EtherType
        if len(raw) >= ctypes.sizeof(EventRecord):
            ethertype = port_host(EventRecord.from_buffer_copy(raw).ethertype)
        return cls(
            timestamp_ns=ev.timestamp,
            ifindex=ev.ifindex,
            direction=DIRECTIONS.get(ev.dir, str(ev.dir)),
            reason=REASONS[ev.reason] if ev.reason < len(REASONS) else str(ev.reason),
            protocol=PROTOCOL_NAMES.get(ev.proto, str(ev.proto)),
            source=ip_str(ev.saddr),
            destination=ip_str(ev.daddr),
            sport=port_host(ev.sport),
            dport=port_host(ev.dport),
            ethertype=ethertype,
        )


class RingBuffer:
    def __init__(self, path: str) -> None:
        self.fd = bpf.obj_get(path)
        self.size = bpf.map_info(self.fd).max_entries
        page = mmap.PAGESIZE
        self.consumer = mmap.mmap(
            self.fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
        )
        self.producer = mmap.mmap(
            self.fd, page + 2 * self.size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
        )
        self.data_offset = page

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()
        os.close(self.fd)

    def __enter__(self) -> RingBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drain(self) -> Iterator[bytes]:
        """Every complete record available now."""
        (consumer,) = struct.unpack_from("<Q", self.consumer, 0)
        (producer,) = struct.unpack_from("<Q", self.producer, 0)
        while consumer < producer:
            offset = self.data_offset + (consumer & (self.size - 1))
            length, _ = struct.unpack_from("<II", self.producer, offset)
            if length & BUSY:
                break
            if not length & DISCARD:
                yield bytes(self.producer[offset + HEADER : offset + HEADER + length])
            consumer += ((length & ~(BUSY | DISCARD)) + HEADER + 7) & ~7
            struct.pack_into("<Q", self.consumer, 0, consumer)

    def skip_backlog(self) -> None:
        """Start after the records already queued."""
        (producer,) = struct.unpack_from("<Q", self.producer, 0)
        struct.pack_into("<Q", self.consumer, 0, producer)

    def wait(self, timeout: float | None) -> bool:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


def follow(path: str, timeout: float | None = None, backlog: bool = True) -> Iterator[DenyEvent]:
    """Deny events as they come (after those already queued, with ``backlog``);
    stops after ``timeout`` seconds without one."""
    with RingBuffer(path) as ring:
        if not backlog:
            ring.skip_backlog()
        while True:
            for record in ring.drain():
                yield DenyEvent.decode(record)
            if not ring.wait(timeout):
                return
