"""The enforcer's endpoints and policies as ``sluicectl`` shows them: what each local
endpoint has installed, and which policies select which local pods."""

from __future__ import annotations

from typing import Any

from cni.agent.enforcer import Enforcer
from cni.policy.model import PodKey


def describe_endpoints(enforcer: Enforcer) -> list[dict[str, Any]]:
    with enforcer.lock:
        installs = enforcer.installs
        out = []
        for key, record in sorted(enforcer.endpoints.items()):
            installed = installs.installed.get(key)
            out.append(
                {
                    "pod": "/".join(record.pod) if record.pod else None,
                    "containerID": record.container_id,
                    "ifname": record.ifname,
                    "ifindex": record.ifindex,
                    "ips": list(record.ips),
                    "ingressIsolated": bool(installed and installed.ingress is not None),
                    "egressIsolated": bool(installed and installed.egress is not None),
                    "policies": ["/".join(p) for p in _selected_by(enforcer, record.pod)],
                    "generation": installs.generations.get(key),
                    "pending": key in installs.dirty or installed is None,
                }
            )
        return out


def describe_policies(enforcer: Enforcer) -> list[dict[str, Any]]:
    """Every policy, with the local pods it selects."""
    with enforcer.lock:
        local = {record.pod: record for record in enforcer.endpoints.values() if record.pod}
        out = []
        for key, found in sorted(enforcer.index.store.policies.items()):
            selects = ["/".join(pod) for pod in sorted(local) if key in _selected_by(enforcer, pod)]
            out.append(
                {
                    "policy": "/".join(key),
                    "policyTypes": [d for d in ("ingress", "egress") if found.isolates(d)],
                    "ingressRules": len(found.rules("ingress")),
                    "egressRules": len(found.rules("egress")),
                    "localPods": selects,
                    "refused": list(found.refusals),  # what it could not read, and why
                }
            )
        return out


def _selected_by(enforcer: Enforcer, pod: PodKey | None) -> list[PodKey]:
    if pod is None:
        return []
    found = enforcer.index.pod(pod)
    return list(enforcer.index.selecting_policies(found)) if found else []
