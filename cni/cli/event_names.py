"""Who is on each side of a deny event, for ``sluicectl datapath monitor``.

An event names the endpoint whose policy decided (its ifindex) and, for an
IPv4 packet, its addresses and ports. The pods behind them: an endpoint's
address is in the datapath's endpoint map, and an address's pod in the IPAM
stores of the network's stateDir (every sluice-ipam allocation records the
pod's namespace and name from CNI_ARGS). Pods on other nodes, Services and
the world stay addresses. The names are read again when an event names an
endpoint or a local address not seen yet (a pod started since), at most once
a second.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from cni.datapath.events import DenyEvent, ethertype_name
from cni.datapath.maps import Datapath, DatapathMissing
from cni.datapath.structs import ip_str
from ipam.errors import IPAMError
from ipam.store import Store, store_networks, store_path

RELOAD_SECONDS = 1.0


class PodNames:
    def __init__(self, datapath: Datapath, state_dir: str | None) -> None:
        self.datapath = datapath
        self.state_dir = state_dir
        self._endpoints: dict[int, str] = {}  # ifindex -> its address
        self._pods: dict[str, str] = {}  # address -> namespace/name
        self._loaded = float("-inf")

    def _load(self) -> None:
        self._loaded = time.monotonic()
        with contextlib.suppress(DatapathMissing):
            self._endpoints = {i: ip_str(ep.ip) for i, ep in self.datapath.endpoints.all().items()}
        if self.state_dir is None:
            return
        pods: dict[str, str] = {}
        for network in store_networks(self.state_dir):
            try:
                with Store(store_path(self.state_dir, network), network) as store:
                    rows = store.allocations()
            except IPAMError:
                continue  # not readable now: its pods stay addresses
            for row in rows:
                if row.pod_namespace and row.pod_name:
                    pods[row.ip] = f"{row.pod_namespace}/{row.pod_name}"
        self._pods = pods

    def _fresh(self, known: bool) -> None:
        if not known and time.monotonic() - self._loaded >= RELOAD_SECONDS:
            self._load()

    def of_address(self, ip: str) -> str | None:
        self._fresh(ip in self._pods or ip not in self._endpoints.values())
        return self._pods.get(ip)

    def of_endpoint(self, ifindex: int) -> str | None:
        self._fresh(ifindex in self._endpoints)
        address = self._endpoints.get(ifindex)
        return self._pods.get(address) if address else None


def endpoint_label(names: PodNames, event: DenyEvent) -> str:
    """The endpoint's pod, else its ifindex."""
    return names.of_endpoint(event.ifindex) or f"ifindex {event.ifindex}"


def _side(names: PodNames, ip: str, port: int, protocol: str) -> str:
    where = f"{ip}:{port}" if protocol in ("tcp", "udp", "sctp") else ip
    pod = names.of_address(ip)
    return f"{pod} {where}" if pod else where


def describe(names: PodNames, event: DenyEvent) -> str:
    """``tcp shop/web 10.0.0.2:40000 -> shop/db 10.0.0.3:80``, or for a frame that is
    not IPv4, ``IPv6 (0x86dd) frame from shop/web`` (to, for a frame to the pod)."""
    names.of_endpoint(event.ifindex)  # an endpoint not seen yet: the names are read again
    if not event.ipv4:
        towards = "from" if event.direction == "egress" else "to"
        return f"{ethertype_name(event.ethertype)} frame {towards} {endpoint_label(names, event)}"
    if event.source == event.destination == "0.0.0.0":  # an IPv4 packet too short to read
        return f"IPv4 packet of {endpoint_label(names, event)}"
    source = _side(names, event.source, event.sport, event.protocol)
    destination = _side(names, event.destination, event.dport, event.protocol)
    return f"{event.protocol:<5} {source} -> {destination}"


def as_json(names: PodNames, event: DenyEvent) -> dict[str, Any]:
    """The event's fields, with the pods and the frame's EtherType beside them."""
    fields: dict[str, Any] = {**event.__dict__, "ethertype": f"0x{event.ethertype:04x}"}
    fields["pod"] = names.of_endpoint(event.ifindex)  # first: it reads new names
    if event.ipv4:
        fields["sourcePod"] = names.of_address(event.source)
        fields["destinationPod"] = names.of_address(event.destination)
    return fields
