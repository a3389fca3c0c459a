"""Installing endpoints' policies: complete rule sets, made live in one write each.

A direction's policy is a list of allow rules (``cni.datapath.ruleset``
compiles them); a direction without a policy is not isolated: everything
passes.

Rule sets are shared by content (``cni.datapath.policy_registry``): an endpoint's
entry names the policy id of each direction, and endpoints whose direction
compiles to the same rule set share its id and inner maps. Installing:

1. every distinct rule set of the batch is compiled once (the registry
   caches by content), and the inner maps of those the node does not have
   yet are built, outside the state lock;
2. under the state lock, new rule sets get ids and are inserted with one
   batched update per outer map (two RCU grace periods for the whole
   batch; none when every rule set is installed already), then each
   endpoint entry is rewritten with its ids and the next generation: one
   map write, so a packet sees the old or the new policy, never a mix.

Flows that conntrack remembers are re-checked against the new generation by
the datapath on their next packet, so a tightened policy cuts them. Ids no
endpoint references any more are deleted later, off the CNI path, by the
reaper (``cni.datapath.reaper``).
"""

from __future__ import annotations

from collections.abc import Mapping

from cni.datapath import policy_registry, reaper
from cni.datapath.maps import Datapath
from cni.datapath.policy_registry import PolicyRegistry
from cni.datapath.ruleset import compile_direction
from cni.datapath.structs import DIRECTIONS, EP_DENY_NODE, NONE, Endpoint
from cni.policy.vocabulary import AllowRule, EndpointPolicy, PolicyError

__all__ = [
    "PolicyRegistry",
    "compile_direction",
    "endpoint_flags",
    "install",
    "install_many",
    "size",
]


def endpoint_flags(policy: EndpointPolicy) -> int:
    """The endpoint entry's flags that the policy sets."""
    return EP_DENY_NODE if policy.deny_node else 0


def install_many(
    datapath: Datapath,
    wanted: Mapping[int, EndpointPolicy],
    registry: PolicyRegistry | None = None,
    failed: dict[int, PolicyError] | None = None,
) -> dict[int, int]:
    """Make each ``wanted[ifindex]`` that endpoint's live policy; return {ifindex:
    generation} of those installed.

    An endpoint whose rules do not compile, or that is not an endpoint, is left
    as it is: with ``failed`` it is reported there, else PolicyError is raised
    (before anything is written, for rules that do not compile).
    """
    registry = registry if registry is not None else PolicyRegistry()
    contents: dict[bytes, tuple[AllowRule, ...]] = {}
    digests: dict[int, tuple[bytes | None, bytes | None]] = {}  # (egress, ingress)
    for ifindex, policy in wanted.items():
        try:
            _refuse_tiers(policy)
            egress = _digest(registry, policy.egress, contents)
            ingress = _digest(registry, policy.ingress, contents)
        except PolicyError as err:
            if failed is None:
                raise
            failed[ifindex] = err
            continue
        digests[ifindex] = (egress, ingress)

    # Outside the lock: the inner maps of rule sets the node does not have (as far as
    # this registry knows, or else the pinned index says).
    unbuilt = [
        d for d in contents if registry.known_id(d) is None and datapath.policies.find(d) is None
    ]
    built = policy_registry.build(registry, contents, unbuilt)
    generations: dict[int, int] = {}
    missing: dict[int, PolicyError] = {}
    try:
        with datapath.lock:
            ids = policy_registry.resolve_ids(datapath, registry, contents, built)
            released = 0
            for ifindex, (egress, ingress) in digests.items():
                current = datapath.endpoints.get(ifindex)
                if current is None:
                    missing[ifindex] = PolicyError(f"ifindex {ifindex} is not an endpoint")
                    continue
                new = Endpoint.from_buffer_copy(current)
                new.flags = endpoint_flags(wanted[ifindex])
                new.egress_policy = ids[egress] if egress is not None else NONE
                new.ingress_policy = ids[ingress] if ingress is not None else NONE
                if bytes(new) != bytes(current):
                    # The one write that switches the endpoint to its new policy.
                    new.policy_gen = (current.policy_gen + 1) & 0xFFFFFFFF
                    datapath.endpoints.put(ifindex, new)
                    released += sum(
                        1 for d in DIRECTIONS if current.policy(d) not in (NONE, new.policy(d))
                    )
                generations[ifindex] = new.policy_gen
            datapath.count_releases(policies=released)
    finally:
        policy_registry.close(built)
        registry.settle(contents)
    reaper.after_release(datapath)
    if missing and failed is None:
        raise next(iter(missing.values()))
    if failed is not None:
        failed.update(missing)
    return generations


def _refuse_tiers(policy: EndpointPolicy) -> None:
    """This datapath judges NetworkPolicy rules only: an endpoint policy with
    cluster-wide tiers is refused whole, never installed without them."""
    if policy.tiers:
        names = ", ".join(repr(tier.name) for tier in policy.tiers)
        raise PolicyError(f"tiers {names}: the datapath compiles no cluster-wide tiers yet")


def _digest(
    registry: PolicyRegistry,
    rules: tuple[AllowRule, ...] | None,
    contents: dict[bytes, tuple[AllowRule, ...]],
) -> bytes | None:
    if rules is None:
        return None
    digest = registry.digest(rules)
    contents.setdefault(digest, rules)
    return digest


def install(
    datapath: Datapath,
    ifindex: int,
    policy: EndpointPolicy,
    registry: PolicyRegistry | None = None,
) -> int:
    """Make ``policy`` the endpoint's live policy; return its generation."""
    return install_many(datapath, {ifindex: policy}, registry)[ifindex]


def size(policy: EndpointPolicy) -> int:
    """Map entries the policy compiles to (peers plus rules)."""
    return sum(
        compile_direction(rules).size
        for rules in (policy.ingress, policy.egress)
        if rules is not None
    )
