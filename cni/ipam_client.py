"""The pod's IPAM: sluice-ipam in-process, or any other IPAM plugin by exec.

Both sides offer the same verbs, so the plugin's verbs never care which one a
network uses.
"""

from __future__ import annotations

from typing import Protocol

from cni import delegate
from cni.errors import ERR_CHECK_FAILED, ERR_NOT_AVAILABLE, CNIError
from cni.protocol import Request
from cni.result import IPConfig, Result, Route
from ipam import config as ipam_config
from ipam.allocator import Allocator, open_allocator

BUILTIN = "sluice-ipam"


class IPAM(Protocol):
    def add(self) -> tuple[Result, bool]:
        """Addresses for the attachment, and whether this call created them."""
        ...

    def delete(self) -> None: ...

    def addresses(self) -> list[str]:
        """The attachment's addresses as far as the IPAM knows them without asking a delegate."""
        ...

    def check(self, expected: list[IPConfig]) -> None: ...

    def status(self) -> None: ...

    def gc(self, valid: set[tuple[str, str]]) -> None: ...


def for_request(request: Request) -> IPAM:
    ipam_type = request.config["ipam"]["type"]
    if ipam_type == BUILTIN:
        return BuiltinIPAM(request)
    return DelegatedIPAM(request, ipam_type)


class BuiltinIPAM:
    def __init__(self, request: Request) -> None:
        self.request = request
        self.config = ipam_config.parse(request.network, request.config)

    def _open(self) -> Allocator:
        return open_allocator(self.config)

    def add(self) -> tuple[Result, bool]:
        r = self.request
        with self._open() as allocator:
            allocation, created = allocator.allocate(
                r.container_id, r.ifname, r.pod_namespace, r.pod_name
            )
        gateway = getattr(self.config, "gateway", None)  # prefix mode has none
        routes = [
            Route(dst=str(route.dst), gw=str(route.gw) if route.gw else "")
            for route in self.config.routes
        ]
        ip = IPConfig(allocation.cidr, str(gateway) if gateway else "")
        result = Result(r.cni_version, ips=[ip], routes=routes)
        return result, created

    def delete(self) -> None:
        with self._open() as allocator:
            allocator.release(self.request.container_id, self.request.ifname)

    def addresses(self) -> list[str]:
        with self._open() as allocator:
            allocation = allocator.find(self.request.container_id, self.request.ifname)
        return [str(allocation.ip)] if allocation else []

    def check(self, expected: list[IPConfig]) -> None:
        r = self.request
        with self._open() as allocator:
            allocation = allocator.find(r.container_id, r.ifname)
        if allocation is None:
            raise CNIError(
                ERR_CHECK_FAILED,
                f"sluice-ipam has no address for container "
                f"{r.container_id!r} interface {r.ifname!r}",
            )
        ips = {str(ip.ip) for ip in expected if ip.version == 4}
        if ips and str(allocation.ip) not in ips:
            raise CNIError(
                ERR_CHECK_FAILED,
                f"sluice-ipam holds {allocation.ip} for container "
                f"{r.container_id!r} interface {r.ifname!r}, prevResult says "
                f"{sorted(ips)}",
            )

    def status(self) -> None:
        try:
            with self._open() as allocator:
                reason = allocator.unavailable_reason()
        except CNIError as err:
            raise CNIError(ERR_NOT_AVAILABLE, err.details) from None
        if reason is not None:
            raise CNIError(ERR_NOT_AVAILABLE, reason)

    def gc(self, valid: set[tuple[str, str]]) -> None:
        with self._open() as allocator:
            allocator.gc(valid)


class DelegatedIPAM:
    def __init__(self, request: Request, plugin_type: str) -> None:
        self.request = request
        self.plugin_type = plugin_type

    def add(self) -> tuple[Result, bool]:
        return delegate.add(self.request, self.plugin_type), True

    def delete(self) -> None:
        delegate.run(self.request, self.plugin_type, "DEL")

    def addresses(self) -> list[str]:
        return []

    def check(self, expected: list[IPConfig]) -> None:
        delegate.run(self.request, self.plugin_type, "CHECK")

    def status(self) -> None:
        delegate.run(self.request, self.plugin_type, "STATUS")

    def gc(self, valid: set[tuple[str, str]]) -> None:
        delegate.run(self.request, self.plugin_type, "GC")
