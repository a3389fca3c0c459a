"""Policy inputs from the Kubernetes API, resolved on this node
(``sluicectl agent --kubeconfig``).

Namespaces, Pods, Services and NetworkPolicies are listed and watched, each
object trimmed to the fields the resolver reads as it arrives. EndpointSlices
are not watched: connections to a Service are judged after kube-proxy's DNAT,
on the backend's own address and port (see the README), so the resolver never
reads them. Nothing is computed, enforced or removed before every collection
has been listed once: until then the agent is not ready and an ADD waits.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from cni.k8s.api import Api
from cni.k8s.informer import Informer
from cni.policy.model import KubeObject, Namespace, NetworkPolicy, Pod, Service
from cni.policy.parse import parse_namespace, parse_network_policy, parse_pod, parse_service

log = logging.getLogger("sluice.k8s")

COLLECTIONS: tuple[tuple[str, type[KubeObject], str, Any], ...] = (
    ("namespaces", Namespace, "/api/v1/namespaces", parse_namespace),
    ("pods", Pod, "/api/v1/pods", parse_pod),
    ("services", Service, "/api/v1/services", parse_service),
    (
        "networkpolicies",
        NetworkPolicy,
        "/apis/networking.k8s.io/v1/networkpolicies",
        parse_network_policy,
    ),
)


class Consumer(Protocol):
    """What the source feeds (the agent's enforcer)."""

    require_known_pods: bool

    def change(self, upserts: list[KubeObject], deletes: list[KubeObject]) -> Any: ...

    def replace_all(self, kind: type[KubeObject], objects: list[KubeObject]) -> None: ...

    def mark_ready(self) -> None: ...


class KubernetesSource:
    def __init__(self, api: Api, enforcer: Consumer) -> None:
        self.api = api
        self.enforcer = enforcer
        self.kinds = {name: kind for name, kind, _, _ in COLLECTIONS}
        self.informers = [
            Informer(api, name, path, parse, self) for name, _, path, parse in COLLECTIONS
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

    # -- the informers' sink ------------------------------------------------------------

    def replace(self, kind: str, objects: list[Any]) -> None:
        self.enforcer.replace_all(self.kinds[kind], objects)

    def change(self, kind: str, event: str, obj: Any) -> None:
        if event == "DELETED":
            self.enforcer.change([], [obj])
        else:
            self.enforcer.change([obj], [])
