"""Which pod an address belongs to, when the API gives it to more than one.

Each address belongs to one pod at a time. A pod deleted, or whose sandbox is
gone, keeps its addresses in the API until its status changes, while the node
may already have given one to a new pod: that pod must not inherit the
allowances meant for the previous holder. So an address two pods claim is
neither's peer, unless one of them is wired on this node (the node that
allocated it knows); and a new endpoint's ADD waits while the API still gives
one of its addresses to another pod (``held_by_another``).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import replace

from cni.policy.model import Pod, PodKey
from cni.policy.store import ObjectStore


def held_by_another(store: ObjectStore, key: PodKey, ips: Iterable[str]) -> str | None:
    """Why a new endpoint of pod ``key`` with these addresses must wait: the API still
    gives one of them to another pod (the previous holder, deleted or with its
    sandbox gone, until its status changes), whose allowances every node would
    otherwise grant the new pod. None: the addresses are free."""
    for ip in ips:
        for other in sorted(store.claimants(ip) - {key}):
            holder = store.pod(other)
            uid = holder.uid if holder is not None else ""
            return (
                f"address {ip} is still pod {other[0]}/{other[1]}'s (uid {uid or '-'}) "
                "as the API reports it"
            )
    return None


class AddressOwnership:
    """The addresses each pod holds alone, given the store's claims and the pods
    wired on this node (``local``, kept by the index, read here)."""

    def __init__(self, store: ObjectStore, local: Set[PodKey]) -> None:
        self.store = store
        self.local = local

    def owned_ips(self, pod: Pod) -> tuple[str, ...]:
        """The pod's addresses no other pod claims, or that this node gave it (the pod
        is local and no other claimant is); ``pod.ips`` itself when that is all."""
        owned = []
        for ip in pod.ips:
            others = self.store.claimants(ip) - {pod.key}
            if not others or (pod.key in self.local and not others & self.local):
                owned.append(ip)
        return tuple(owned) if len(owned) != len(pod.ips) else pod.ips

    def peer_view(self, pod: Pod) -> Pod:
        """The pod with only the addresses it holds alone (what peers see of it)."""
        owned = self.owned_ips(pod)
        return pod if owned is pod.ips else replace(pod, ips=owned)

    def contenders(self, key: PodKey, ips: Iterable[str]) -> set[PodKey]:
        """The other pods that claim any of ``ips``: their share of them may change."""
        return {other for ip in ips for other in self.store.claimants(ip)} - {key}
