"""One pod's endpoint: its entries in the maps, the programs on its node-side veth, sweeps.

ADD registers the endpoint (``register``: its addresses, an empty conntrack
table of its own, taken from the pool: ``cni.datapath.ctpool``) and attaches
the pinned programs (``attach_new``: tcx ingress of the node-side veth:
traffic from the pod; tcx egress: traffic to the pod; ``cni.datapath.attach``),
both before the pod's interface is up (the caller may run them at once, the
pair being down). With a stocked pool no map of maps is written (each write
would cost an RCU grace period).

Every function works on an open ``Datapath`` (cni.datapath.maps), the one
handle its process holds for that bpfDir. Every writer of the pinned state
holds its state lock (``datapath.lock``). Removal goes veth
first (the caller deletes it, or takes it down: ``forget``, then
``release_links`` once it is deleted), then links and entries, so a pair is
never up, routed and unfiltered. Removal writes plain maps only: the table
and policy maps the endpoint used are garbage that the reaper
(``cni.datapath.reaper``) deletes or refills later.
"""

from __future__ import annotations

# _socket, not socket: the module's enums and selectors cost a one-call process.
import _socket as socket
import contextlib
import ctypes
import os

from cni.datapath import bpf, ctpool, reaper
from cni.datapath.attach import HOOKS, LINKS, attach_programs, unpin_links
from cni.datapath.maps import Datapath, DatapathMissing
from cni.datapath.structs import Endpoint, ip_be
from cni.net import sysctl
from cni.net.netlink import Rtnl
from cni.spec.errors import ERR_KERNEL, CNIError


def no_ipv6_from_pod(name: str) -> None:
    """The node-side veth takes no IPv6 (so no router advertisement) from the pod;
    set before the link is up."""
    for key, value in (("accept_ra", "0"), ("disable_ipv6", "1")):
        path = sysctl.path(f"net.ipv6.conf.{name}.{key}")
        with contextlib.suppress(FileNotFoundError), open(path, "w") as f:
            f.write(value)


def register(
    datapath: Datapath, ifindex: int, name: str, pod_ips: list[str], flags: int = 0
) -> None:
    """The endpoint's entries and an empty conntrack table of its own; its programs are
    attached apart (``attach_new``), before the veth is up.

    ``pod_ips`` are all of the pod's IPv4 addresses: any other source from the
    pod is spoofed."""
    if not pod_ips:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": no pod address')
    try:
        entries = datapath.conntrack.capacity()
        with datapath.lock:
            free = ctpool.take(datapath, entries)
            own_table = free is None
            slot = datapath.conntrack.allocate_slots(1)[0] if free is None else free
            if datapath.endpoints.get(ifindex) is not None:
                datapath.endpoints.delete(ifindex)  # of an earlier device with this ifindex
            datapath.endpoints.put(
                ifindex, Endpoint(ip=ip_be(pod_ips[0]), flags=flags, ct_slot=slot)
            )
            datapath.endpoints.add_ips(ifindex, pod_ips)
            datapath.endpoints.reset_stats(ifindex)
        if own_table:
            # No free table: insert one, outside the lock (a grace period, which
            # concurrent ADDs wait for at the same time). The entry names the slot
            # already, so no reaper takes the table for garbage.
            datapath.conntrack.insert_tables([slot], entries)
        reaper.table_taken(datapath)
    except (bpf.BPFError, DatapathMissing) as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def attach_new(
    datapath: Datapath, ipr: Rtnl | None, ifindex: int, name: str, tcx: bool = True
) -> None:
    """The endpoint programs on a new veth (``ipr``: a node socket for clsact filters,
    None to open one), errors as CNI errors. ``tcx`` False: clsact filters even where
    the kernel has tcx (the datapath's "attach": "tc")."""
    try:
        attach_programs(datapath, ipr, ifindex, name, tcx=tcx)
    except bpf.BPFError as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def detach(datapath: Datapath, ifindex: int, ips: list[str] | None = None) -> None:
    """Forget the endpoint and release its links (``ips``: its addresses, if the
    caller knows them: see ``Datapath.delete_endpoint``). The caller deletes the veth
    first, so the pair is gone before its filter is. No map of maps is written: what
    the endpoint used is left to the reaper."""
    try:
        with datapath.lock:
            unpin_links(datapath, ifindex, HOOKS)
            datapath.endpoints.delete(ifindex, ips)
        reaper.after_release(datapath)
    except DatapathMissing:
        with datapath.lock:
            unpin_links(datapath, ifindex, HOOKS)  # nothing was ever loaded here


def forget(datapath: Datapath, ifindex: int, ips: list[str] | None = None) -> None:
    """Forget the endpoint but keep its links (``release_links`` after the veth is
    deleted): with no entry its programs drop every packet, so the caller must have
    cut the pair off (taken it down) or deleted it first. ``ips`` as for ``detach``."""
    try:
        datapath.endpoints.delete(ifindex, ips)
        reaper.after_release(datapath)
    except DatapathMissing:
        pass


def forget_gone(datapath: Datapath, ips: list[str]) -> None:
    """Detach the endpoints registered for ``ips`` whose veth is gone (a DEL that
    finds no veth: its ifindex is known only to the maps)."""
    owners: set[int] = set()
    try:
        for ip in ips:
            owner = datapath.endpoints.owner_of(ip)
            if owner is not None:
                owners.add(owner)
    except DatapathMissing:
        return
    for ifindex in sorted(owners):
        if not is_live(ifindex):
            detach(datapath, ifindex, ips)


def release_links(datapath: Datapath, ifindex: int) -> None:
    """Unpin the links of a veth that is gone (a live one would make the kernel wait
    for a grace period, holding the RTNL lock, to take each program off)."""
    with datapath.lock:
        unpin_links(datapath, ifindex, HOOKS)


def live_ifindexes() -> set[int]:
    return {index for index, _ in socket.if_nameindex()}


def is_live(ifindex: int) -> bool:
    try:
        socket.if_indextoname(ifindex)
    except OSError:
        return False
    return True


def sweep(datapath: Datapath, live: set[int] | None = None) -> int:
    """Remove endpoints whose veth is gone and everything keyed by them; return how many.

    Under the state lock, each candidate is checked again just before it goes
    (``live`` is only a hint), so an endpoint or link a concurrent ADD has just
    created is never removed. Like DEL it writes no map of maps: the tables and
    policy ids the removed endpoints used are left to the reaper."""
    with datapath.lock:
        links_dir = datapath.path(LINKS)
        if os.path.isdir(links_dir):
            for pin in os.listdir(links_dir):
                ifindex = int(pin.split("_", 1)[0])
                if (live is None or ifindex not in live) and not is_live(ifindex):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(links_dir, pin))
        try:
            known = datapath.endpoints.all()
            gone = [i for i in known if (live is None or i not in live) and not is_live(i)]
            for ifindex in gone:
                datapath.endpoints.delete(ifindex)
                del known[ifindex]
            for ip, ifindex in datapath.endpoints.ips().items():
                if ifindex not in known:
                    bpf.map_delete(datapath.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)))
            for key in list(datapath.keys("ep_stats", ctypes.c_uint32)):
                if key.value not in known:
                    bpf.map_delete(datapath.fd("ep_stats"), key)
            return len(gone)
        except DatapathMissing:
            return 0


class DatapathEndpoints:
    """The ``EndpointRegistry`` (cni.datapath.interfaces) of an open ``Datapath``:
    this module's functions, on that handle."""

    def __init__(self, datapath: Datapath) -> None:
        self.datapath = datapath

    def attach(self, ifindex: int, name: str, tcx: bool) -> None:
        attach_new(self.datapath, None, ifindex, name, tcx)

    def register(self, ifindex: int, name: str, ips: list[str]) -> None:
        register(self.datapath, ifindex, name, ips)

    def detach(self, ifindex: int, ips: list[str] | None) -> None:
        detach(self.datapath, ifindex, ips)

    def forget(self, ifindex: int, ips: list[str]) -> None:
        forget(self.datapath, ifindex, ips)

    def release_links(self, ifindex: int) -> None:
        release_links(self.datapath, ifindex)

    def forget_gone(self, ips: list[str]) -> None:
        forget_gone(self.datapath, ips)

    def sweep_gone(self) -> None:
        sweep(self.datapath, live_ifindexes())
