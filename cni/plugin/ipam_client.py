"""The attachment's IPAM as the CNI verbs see it: sluice-ipam in-process, or
any other IPAM plugin by exec. Both offer the same operations, so the verbs
never care which one a network uses; IPAM failures become CNI errors here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from cni.plugin import delegate
from cni.plugin.netconf import DelegatedIPAM, IPAMConf
from cni.spec.attachment import Attachment
from cni.spec.errors import ERR_CHECK_FAILED, ERR_NOT_AVAILABLE, CNIError, from_ipam
from cni.spec.result import IPConfig, Result, Route
from ipam.allocator import Allocator
from ipam.config import NodeCIDRConfig, PrefixConfig
from ipam.errors import IPAMError
from ipam.modes import open_allocator


class IPAM(Protocol):
    def __enter__(self) -> IPAM: ...

    def __exit__(self, *exc: object) -> None: ...

    def add(self, attachment: Attachment) -> tuple[Result, bool]:
        """Addresses for the attachment, and whether this call created them."""
        ...

    def delete(self, attachment: Attachment) -> None: ...

    def addresses(self, attachment: Attachment) -> list[str]:
        """The attachment's addresses as far as the IPAM knows them without asking a delegate."""
        ...

    def check(self, attachment: Attachment, expected: list[IPConfig]) -> None: ...

    def status(self) -> None: ...

    def gc(self, valid: set[tuple[str, str]]) -> None: ...


def client(conf: IPAMConf, cni_version: str, kept: KeptAllocators | None = None) -> IPAM:
    """The network's IPAM; use it in a ``with`` block (the store stays open in it).
    ``kept``: the open allocators of a long-lived process, to borrow from."""
    if isinstance(conf, DelegatedIPAM):
        return DelegatedClient(conf, cni_version)
    return BuiltinClient(conf, cni_version, kept)


class KeptAllocators:
    """Open allocators a long-lived process (the agent, which holds one of these for
    its life and hands it to the verbs) reuses: opening the store costs more than
    most of what a call then does with it. Each is lent to one client at a time,
    and may go from thread to thread."""

    def __init__(self) -> None:
        self._idle: dict[NodeCIDRConfig | PrefixConfig, list[Allocator]] = {}
        self._lock = threading.Lock()

    def take(self, config: NodeCIDRConfig | PrefixConfig) -> Allocator:
        with self._lock:
            idle = self._idle.get(config)
            if idle:
                return idle.pop()
        return open_allocator(config, threads=True)

    def give(self, config: NodeCIDRConfig | PrefixConfig, allocator: Allocator) -> None:
        with self._lock:
            self._idle.setdefault(config, []).append(allocator)

    @contextmanager
    def idle(self, config: NodeCIDRConfig | PrefixConfig) -> Iterator[Allocator | None]:
        """An allocator that is open and idle, lent for a moment; None when every one is
        in use or none was opened yet (a reader that must not open the store, the
        metrics, then skips its read)."""
        with self._lock:
            idle = self._idle.get(config)
            allocator = idle.pop() if idle else None
        try:
            yield allocator
        finally:
            if allocator is not None:
                self.give(config, allocator)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for allocators in idle.values():
            for allocator in allocators:
                allocator.close()


@contextmanager
def cni_errors() -> Iterator[None]:
    try:
        yield
    except IPAMError as err:
        raise from_ipam(err) from None


class BuiltinClient:
    def __init__(
        self,
        config: NodeCIDRConfig | PrefixConfig,
        cni_version: str,
        kept: KeptAllocators | None = None,
    ) -> None:
        self.config = config
        self.cni_version = cni_version
        self.kept = kept
        self._open: Allocator | None = None

    def __enter__(self) -> BuiltinClient:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._open is not None:
            if self.kept is not None and exc[0] is None:
                self.kept.give(self.config, self._open)
            else:  # after a failure, a fresh one next time
                self._open.close()
            self._open = None

    @contextmanager
    def _allocator(self) -> Iterator[Allocator]:
        with cni_errors():
            if self._open is None:
                kept = self.kept
                self._open = kept.take(self.config) if kept else open_allocator(self.config)
            yield self._open

    def add(self, attachment: Attachment) -> tuple[Result, bool]:
        with self._allocator() as allocator:
            allocation, created = allocator.allocate(
                attachment.container_id,
                attachment.ifname,
                attachment.pod_namespace,
                attachment.pod_name,
            )
        gateway = getattr(self.config, "gateway", None)  # prefix mode has none
        routes = [Route(dst=str(r.dst), gw=str(r.gw) if r.gw else "") for r in self.config.routes]
        ip = IPConfig(allocation.cidr, str(gateway) if gateway else "")
        return Result(self.cni_version, ips=[ip], routes=routes), created

    def delete(self, attachment: Attachment) -> None:
        with self._allocator() as allocator:
            allocator.release(attachment.container_id, attachment.ifname)

    def addresses(self, attachment: Attachment) -> list[str]:
        with self._allocator() as allocator:
            allocation = allocator.find(attachment.container_id, attachment.ifname)
        return [str(allocation.ip)] if allocation else []

    def check(self, attachment: Attachment, expected: list[IPConfig]) -> None:
        with self._allocator() as allocator:
            allocation = allocator.find(attachment.container_id, attachment.ifname)
        whose = f"container {attachment.container_id!r} interface {attachment.ifname!r}"
        if allocation is None:
            raise CNIError(ERR_CHECK_FAILED, f"sluice-ipam has no address for {whose}")
        ips = {str(ip.ip) for ip in expected if ip.version == 4}
        if ips and str(allocation.ip) not in ips:
            raise CNIError(
                ERR_CHECK_FAILED,
                f"sluice-ipam holds {allocation.ip} for {whose}, prevResult says {sorted(ips)}",
            )

    def status(self) -> None:
        try:
            with self._allocator() as allocator:
                reason = allocator.unavailable_reason()
        except CNIError as err:
            raise CNIError(ERR_NOT_AVAILABLE, err.details) from None
        if reason is not None:
            raise CNIError(ERR_NOT_AVAILABLE, reason)

    def gc(self, valid: set[tuple[str, str]]) -> None:
        with self._allocator() as allocator:
            allocator.gc(valid)


class DelegatedClient:
    """The delegate sees the runtime's own call: its environment names the attachment."""

    def __init__(self, conf: DelegatedIPAM, cni_version: str) -> None:
        self.conf = conf
        self.cni_version = cni_version

    def __enter__(self) -> DelegatedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def add(self, attachment: Attachment) -> tuple[Result, bool]:
        return delegate.add(self.conf, self.cni_version), True

    def delete(self, attachment: Attachment) -> None:
        delegate.run(self.conf, "DEL")

    def addresses(self, attachment: Attachment) -> list[str]:
        return []

    def check(self, attachment: Attachment, expected: list[IPConfig]) -> None:
        delegate.run(self.conf, "CHECK")

    def status(self) -> None:
        delegate.run(self.conf, "STATUS")

    def gc(self, valid: set[tuple[str, str]]) -> None:
        delegate.run(self.conf, "GC")
