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
from cni.policy.published.names import (
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    TARGETS_NODE_LABEL,
    collection_path,
    node_label,
    node_label_key,
)
from cni.policy.published.shards import (
    AddressShard,
    PolicyShard,
    TargetsShard,
    parse_address_set,
    parse_policy_endpoints,
    parse_policy_targets,
)


def controller_collections(node: str) -> tuple[Collection, ...]:
    for_node = {"labelSelector": node_label_key(node)}
    return (
        ("pods", Pod, "/api/v1/pods", parse_pod, {"fieldSelector": f"spec.nodeName={node}"}),
        ("services", Service, "/api/v1/services", parse_service, {}),
        (
            "policytargets",
            TargetsShard,
            collection_path(POLICY_TARGETS),
            parse_policy_targets,
            {"labelSelector": f"{TARGETS_NODE_LABEL}={node_label(node)}"},
        ),
        (
            "policyendpoints",
            PolicyShard,
            collection_path(POLICY_ENDPOINTS),
            parse_policy_endpoints,
            for_node,
        ),
        (
            "addresssets",
            AddressShard,
            collection_path(ADDRESS_SET),
            parse_address_set,
            for_node,
        ),
    )
