"""The node's ``PolicyWriter`` (``cni.datapath.interfaces``): the pinned maps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cni.datapath import policy_install
from cni.datapath.maps import Datapath
from cni.datapath.policy_registry import PolicyRegistry
from cni.policy.vocabulary import EndpointPolicy, PolicyError


class DatapathPolicyWriter:
    """Policies installed with ``policy_install.install_many`` into ``datapath``.

    One registry for the writer's lifetime: each distinct rule set is compiled
    once, and the policy ids it saw spare lookups in the pinned index."""

    def __init__(self, datapath: Datapath, registry: PolicyRegistry | None = None) -> None:
        self.datapath = datapath
        self.registry = registry if registry is not None else PolicyRegistry()

    def install_many(
        self, wanted: Mapping[int, EndpointPolicy], failed: dict[int, PolicyError]
    ) -> dict[int, int]:
        return policy_install.install_many(self.datapath, wanted, self.registry, failed)

    def set_service_addresses(self, addresses: Iterable[str]) -> None:
        self.datapath.network.set_service_ips(addresses)
