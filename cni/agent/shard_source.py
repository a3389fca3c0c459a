"""What an agent watches when the controller resolves selectors
(``sluicectl agent --resolver controller``): nothing cluster-wide but Services.

- its node's pods (field selector ``spec.nodeName``): their ports (ingress
  named ports resolve on the target pod) and uids;
- its node's PolicyTargets (label ``sluice.dev/node``): which policies select
  each of those pods;
- the PolicyEndpoints and AddressSets labelled ``node.sluice.dev/<node>``:
  the policies that select a pod here, and the pods their selectors pick;
- Services: their ClusterIPs, which the datapath must recognise (it judges a
  Service connection on the backend it reaches; see docs/datapath.md).

The objects go to the enforcer as they are; its resolver is a ``ShardIndex``.
"""

from __future__ import annotations

from cni.agent.kube_source import Collection
from cni.policy.model import Pod, Service
from cni.policy.parse import parse_pod, parse_service
from cni.policy.published import objects
from cni.policy.published.objects import ADDRESS_SET, POLICY_ENDPOINTS, POLICY_TARGETS


def controller_collections(node: str) -> tuple[Collection, ...]:
    for_node = {"labelSelector": objects.node_label_key(node)}
    return (
        ("pods", Pod, "/api/v1/pods", parse_pod, {"fieldSelector": f"spec.nodeName={node}"}),
        ("services", Service, "/api/v1/services", parse_service, {}),
        (
            "policytargets",
            objects.TargetsShard,
            objects.collection_path(POLICY_TARGETS),
            objects.parse_policy_targets,
            {"labelSelector": f"{objects.TARGETS_NODE_LABEL}={objects.node_label(node)}"},
        ),
        (
            "policyendpoints",
            objects.PolicyShard,
            objects.collection_path(POLICY_ENDPOINTS),
            objects.parse_policy_endpoints,
            for_node,
        ),
        (
            "addresssets",
            objects.AddressShard,
            objects.collection_path(ADDRESS_SET),
            objects.parse_address_set,
            for_node,
        ),
    )
