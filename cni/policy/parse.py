"""Kubernetes objects (API JSON or manifest YAML, as dicts) into the resolver's model.

Only the fields the resolver reads are kept. Validation follows the API
server's, so a manifest the API server would refuse is refused here too, and
every error names the object, the field path and the value:
``NetworkPolicy x/deny: spec.ingress[0].ports[1].endPort 70 is lower than port 80``.

NetworkPolicy objects have a module of their own, ``parse_policy``; the field
checks all kinds share are ``fields``.

Conventions of the local store, as the API server has them:
- a Namespace always carries ``kubernetes.io/metadata.name: <its name>``;
- an object without ``metadata.namespace`` is in ``default``;
- a Pod may carry ``status.podIPs``/``status.podIP`` (a remote pod) or no
  address yet (a local pod, addressed later by the agent);
- a Pod in phase Succeeded or Failed has no address: its address may already
  belong to another pod.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from cni.policy.errors import MISSING, PolicyInputError
from cni.policy.fields import FieldReader
from cni.policy.model import (
    NAMESPACE_NAME_LABEL,
    ContainerPort,
    KubeObject,
    Namespace,
    Pod,
    Service,
    ServicePort,
    labels_of,
)
from cni.policy.parse_policy import parse_network_policy

TERMINATED_PHASES = ("Succeeded", "Failed")


def parse_namespace(obj: Mapping[str, Any]) -> Namespace:
    reader = FieldReader("Namespace")
    reader.api_version(reader.mapping(obj, ""))
    _, name = reader.metadata(obj, namespaced=False)
    labels = reader.labels(reader.mapping(obj.get("metadata"), "").get("labels"), "metadata.labels")
    # As the API server does: the name label is always there and always right.
    pairs = {k: v for k, v in labels if k != NAMESPACE_NAME_LABEL}
    pairs[NAMESPACE_NAME_LABEL] = name
    return Namespace(sys.intern(name), labels_of(pairs))


def _container_ports(reader: FieldReader, spec: Mapping[str, Any]) -> tuple[ContainerPort, ...]:
    ports = []
    for c, container in enumerate(reader.items(spec.get("containers"), "spec.containers")):
        at = f"spec.containers[{c}]"
        container = reader.mapping(container, at)
        for p, port in enumerate(reader.items(container.get("ports"), f"{at}.ports")):
            at_port = f"{at}.ports[{p}]"
            port = reader.mapping(port, at_port)
            name = port.get("name")
            if name is not None:
                name = reader.port_name(reader.string(name, f"{at_port}.name"), f"{at_port}.name")
            number = reader.integer(port.get("containerPort"), f"{at_port}.containerPort", 1, 65535)
            protocol = reader.protocol(port.get("protocol"), f"{at_port}.protocol")
            ports.append(ContainerPort(name or "", number, protocol))
    return tuple(ports)


def _pod_ips(reader: FieldReader, status: Mapping[str, Any]) -> tuple[str, ...]:
    if status.get("phase") in TERMINATED_PHASES:
        return ()
    ips = []
    for i, entry in enumerate(reader.items(status.get("podIPs"), "status.podIPs")):
        at = f"status.podIPs[{i}]"
        ips.append(reader.ip(reader.mapping(entry, at).get("ip"), f"{at}.ip"))
    if not ips and status.get("podIP"):
        ips.append(reader.ip(status["podIP"], "status.podIP"))
    return tuple(dict.fromkeys(ips))


def parse_pod(obj: Mapping[str, Any]) -> Pod:
    reader = FieldReader("Pod")
    reader.api_version(reader.mapping(obj, ""))
    namespace, name = reader.metadata(obj, namespaced=True)
    spec = reader.mapping(obj.get("spec"), "spec")
    return Pod(
        namespace=namespace,
        name=name,
        labels=reader.labels(obj["metadata"].get("labels"), "metadata.labels"),
        ips=_pod_ips(reader, reader.mapping(obj.get("status"), "status")),
        node_name=sys.intern(reader.string(spec.get("nodeName") or "", "spec.nodeName")),
        ports=_container_ports(reader, spec),
        host_network=reader.boolean(spec.get("hostNetwork"), "spec.hostNetwork"),
        uid=str(obj["metadata"].get("uid") or ""),
    )


def parse_service(obj: Mapping[str, Any]) -> Service:
    reader = FieldReader("Service")
    reader.api_version(reader.mapping(obj, ""))
    namespace, name = reader.metadata(obj, namespaced=True)
    spec = reader.mapping(obj.get("spec"), "spec")
    cluster_ips = reader.items(spec.get("clusterIPs"), "spec.clusterIPs")
    paths = [f"spec.clusterIPs[{i}]" for i in range(len(cluster_ips))]
    if not cluster_ips and spec.get("clusterIP"):
        cluster_ips, paths = [spec["clusterIP"]], ["spec.clusterIP"]
    ips = tuple(
        reader.ip(ip, at) for ip, at in zip(cluster_ips, paths, strict=True) if ip != "None"
    )
    selector = spec.get("selector")
    ports = []
    for i, port in enumerate(reader.items(spec.get("ports"), "spec.ports")):
        at = f"spec.ports[{i}]"
        port = reader.mapping(port, at)
        number = reader.integer(port.get("port"), f"{at}.port", 1, 65535)
        target = port.get("targetPort", number)
        ports.append(
            ServicePort(
                name=reader.string(port.get("name") or "", f"{at}.name"),
                port=number,
                target_port=reader.port_name(target, f"{at}.targetPort")
                if isinstance(target, str)
                else reader.integer(target, f"{at}.targetPort", 1, 65535),
                protocol=reader.protocol(port.get("protocol"), f"{at}.protocol"),
            )
        )
    return Service(
        namespace=namespace,
        name=name,
        cluster_ips=ips,
        selector=None if selector is None else reader.labels(selector, "spec.selector"),
        ports=tuple(ports),
    )


PARSERS: dict[str, Callable[[Mapping[str, Any]], KubeObject]] = {
    "Namespace": parse_namespace,
    "Pod": parse_pod,
    "NetworkPolicy": parse_network_policy,
    "Service": parse_service,
}


def parse_object(obj: Mapping[str, Any]) -> KubeObject:
    """Any of the kinds the resolver reads, chosen by ``kind``."""
    if not isinstance(obj, Mapping):
        raise PolicyInputError("object", "", obj, "must be an object")
    kind = obj.get("kind")
    if kind not in PARSERS:
        raise PolicyInputError(
            "object",
            "kind",
            MISSING if kind is None else kind,
            "is not one of " + ", ".join(PARSERS),
        )
    return PARSERS[kind](obj)
