"""An ``EndpointRegistry`` (``cni.datapath.interfaces``) that records what the plugin's
wiring asks of the datapath, and whether the veth still existed when it asked.

On its own it keeps the endpoints in memory (no datapath, no bpf filesystem);
given a real registry (``DatapathEndpoints``) it passes every call on after
recording it. ``fail_next(method)`` makes the next call of that method raise
a ``CNIError`` before anything is passed on, as a refused attach or map write
does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from socket import if_indextoname

from cni.datapath.interfaces import EndpointRegistry
from cni.spec.errors import ERR_KERNEL, CNIError


@dataclass(frozen=True)
class Call:
    method: str
    ifindex: int | None
    veth_existed: bool | None  # None: the call names no veth
    ips: tuple[str, ...] = ()


def veth_exists(ifindex: int) -> bool:
    try:
        return Path(f"/sys/class/net/{if_indextoname(ifindex)}").exists()
    except OSError:
        return False


@dataclass
class RecordingEndpoints:
    passes_to: EndpointRegistry | None = None
    calls: list[Call] = field(default_factory=list)
    registered: dict[int, tuple[str, ...]] = field(default_factory=dict)
    attached: set[int] = field(default_factory=set)
    _failures: dict[str, CNIError] = field(default_factory=dict)

    def fail_next(self, method: str, details: str = "refused") -> None:
        self._failures[method] = CNIError(ERR_KERNEL, f"{method}: {details}")

    def methods(self) -> list[str]:
        return [call.method for call in self.calls]

    def _record(self, method: str, ifindex: int | None, ips: list[str] | None = None) -> None:
        existed = veth_exists(ifindex) if ifindex is not None else None
        self.calls.append(Call(method, ifindex, existed, tuple(ips or ())))
        failure = self._failures.pop(method, None)
        if failure is not None:
            raise failure

    # -- the EndpointRegistry --------------------------------------------------------------

    def attach(self, ifindex: int, name: str, tcx: bool) -> None:
        self._record("attach", ifindex)
        if self.passes_to is not None:
            self.passes_to.attach(ifindex, name, tcx)
        self.attached.add(ifindex)

    def register(self, ifindex: int, name: str, ips: list[str]) -> None:
        self._record("register", ifindex, ips)
        if self.passes_to is not None:
            self.passes_to.register(ifindex, name, ips)
        self.registered[ifindex] = tuple(ips)

    def detach(self, ifindex: int, ips: list[str] | None) -> None:
        self._record("detach", ifindex, ips)
        if self.passes_to is not None:
            self.passes_to.detach(ifindex, ips)
        self.registered.pop(ifindex, None)
        self.attached.discard(ifindex)

    def forget(self, ifindex: int, ips: list[str]) -> None:
        self._record("forget", ifindex, ips)
        if self.passes_to is not None:
            self.passes_to.forget(ifindex, ips)
        self.registered.pop(ifindex, None)

    def release_links(self, ifindex: int) -> None:
        self._record("release_links", ifindex)
        if self.passes_to is not None:
            self.passes_to.release_links(ifindex)
        self.attached.discard(ifindex)

    def forget_gone(self, ips: list[str]) -> None:
        self._record("forget_gone", None, ips)
        if self.passes_to is not None:
            self.passes_to.forget_gone(ips)
        for ifindex in [i for i, held in self.registered.items() if set(held) & set(ips)]:
            if not veth_exists(ifindex):
                del self.registered[ifindex]

    def sweep_gone(self) -> None:
        self._record("sweep_gone", None)
        if self.passes_to is not None:
            self.passes_to.sweep_gone()
        for ifindex in [i for i in self.registered if not veth_exists(i)]:
            del self.registered[ifindex]
