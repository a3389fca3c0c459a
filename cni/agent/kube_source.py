"""Policy inputs from the Kubernetes API (``sluicectl agent --kubeconfig``).

Resolved on this node (``COLLECTIONS``, the default): Namespaces, Pods,
Services and NetworkPolicies are listed and watched, each object trimmed to
the fields the resolver reads as it arrives. EndpointSlices are not watched:
connections to a Service are judged after kube-proxy's DNAT, on the backend's
own address and port (see docs/datapath.md), so the resolver never reads them.
Nodes are watched apart, by the route keeper (cni/agent/routes.py), which needs
none of the policy inputs and does not hold up the agent's readiness.

Resolved by the controller (``--resolver controller``): the collections of
``shard_source.controller_collections``, for this node only.

Either way, nothing is computed, enforced or removed before every collection
has been listed once: until then the agent is not ready and an ADD waits.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from cni.kube.api import Api
from cni.kube.informer import Informer
from cni.kube.memory import release_free_memory
from cni.policy.model import Namespace, NetworkPolicy, Pod, Service
from cni.policy.parse import parse_namespace, parse_pod, parse_service
from cni.policy.parse_policy import read_network_policy

log = logging.getLogger("sluice.k8s")

# (name, the kind the enforcer gets, path, parse[, query parameters])
Collection = tuple[str, type, str, Any, dict[str, str]]

COLLECTIONS: tuple[Collection, ...] = (
    ("namespaces", Namespace, "/api/v1/namespaces", parse_namespace, {}),
    ("pods", Pod, "/api/v1/pods", parse_pod, {}),
    ("services", Service, "/api/v1/services", parse_service, {}),
    (
        "networkpolicies",
        NetworkPolicy,
        "/apis/networking.k8s.io/v1/networkpolicies",
        read_network_policy,  # fails closed: what it cannot read isolates, allows nothing
        {},
    ),
)


class Consumer(Protocol):
    """What the source feeds (the agent's enforcer)."""

    require_known_pods: bool

    def change(self, upserts: list[Any], deletes: list[Any]) -> Any: ...

    def replace_all(self, kind: type, objects: list[Any]) -> None: ...

    def mark_ready(self) -> None: ...


class KubernetesSource:
    def __init__(
        self, api: Api, enforcer: Consumer, collections: tuple[Collection, ...] = COLLECTIONS
    ) -> None:
        self.api = api
        self.enforcer = enforcer
        self.kinds = {name: kind for name, kind, _, _, _ in collections}
        self.informers = [
            Informer(api, name, path, parse, self, params)
            for name, _, path, parse, params in collections
        ]
        self._gate = threading.Thread(target=self._wait_synced, name="sync-gate", daemon=True)

    def start(self) -> None:
        self.enforcer.require_known_pods = True
        for informer in self.informers:
            informer.start()
        self._gate.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        self.api.close()

    def unsynced(self) -> list[str]:
        return [i.kind for i in self.informers if not i.synced.is_set()]

    def _wait_synced(self) -> None:
        for informer in self.informers:
            informer.synced.wait()
        log.info("every collection is synced: computing and enforcing policies")
        self.enforcer.mark_ready()
        release_free_memory()  # what the lists and the first computations left free

    # -- the informers' sink ------------------------------------------------------------

    def replace(self, kind: str, objects: list[Any]) -> None:
        self.enforcer.replace_all(self.kinds[kind], objects)

    def change(self, kind: str, event: str, obj: Any) -> None:
        if event == "DELETED":
            self.enforcer.change([], [obj])
        else:
            self.enforcer.change([obj], [])
