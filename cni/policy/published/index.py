"""The agent's resolver when a controller resolves selectors
(``sluicectl agent --resolver controller``).

It holds what the agent's ``ShardSource`` receives: the node's own pods, the
Services (their ClusterIPs, for the datapath), and the controller's objects
for this node (``shards``): the node's PolicyTargets, the PolicyEndpoints of
every policy that selects a pod here, and the AddressSets those policies read.
It answers the enforcer exactly as ``PolicyIndex`` does (``upsert``,
``delete``, ``replace_all``, ``resolve``, ...), with the same semantics: each
policy is compiled by ``rules.compile_policy`` from its address sets, and a
pod's policies combine in ``resolve.resolve_pod``.

A pod's policy is computable only when all of this holds (else ``resolve``
raises ``PolicyIncomplete`` and the enforcer keeps what the datapath has):

- the node's PolicyTargets set is complete and lists the pod, with the pod's
  uid (so the controller has seen this pod, not an earlier one of that name);
- every policy listed for it has its PolicyEndpoints complete;
- every address set those name is complete.
"""

from __future__ import annotations

import logging
from typing import Any

from cni.policy.kinds import KindHandlers
from cni.policy.model import Pod, PodKey, PolicyKey, Service
from cni.policy.published.names import ADDRESS_SET, POLICY_ENDPOINTS, POLICY_TARGETS
from cni.policy.published.sets import AddressSetKey, PublishedPeers, PublishedSet, address_sets
from cni.policy.published.shards import AddressShard, PolicyShard, TargetEntry, TargetsShard
from cni.policy.published.shardsets import SetKey, ShardSets
from cni.policy.resolve import PodPolicyResolver
from cni.policy.rules import CompiledPolicy, compile_policy

log = logging.getLogger("sluice.k8s")

NOTHING: frozenset[PodKey] = frozenset()
Published = PolicyShard | AddressShard | TargetsShard


class ShardIndex(PodPolicyResolver[Pod | Service | Published]):
    def __init__(self, node_name: str) -> None:
        # ``store``: local pods and Services, as PolicyIndex has them; its ``policies``
        # are those of complete PolicyEndpoints.
        super().__init__()
        self.node_name = node_name
        self._policy_shards: ShardSets[PolicyShard] = ShardSets()
        self._address_shards: ShardSets[AddressShard] = ShardSets()
        self._target_shards: ShardSets[TargetsShard] = ShardSets()
        self._sets: dict[str, PublishedSet] = {}  # complete address sets by id
        self._set_shards: dict[str, tuple[AddressShard, ...]] = {}  # what _sets was made of
        self._policies: dict[PolicyKey, PolicyShard] = {}  # complete PolicyEndpoints
        self._set_users: dict[str, set[PolicyKey]] = {}  # address set id -> its policies
        self._targets: dict[PodKey, TargetEntry] = {}  # from the complete PolicyTargets
        self._listed: dict[PolicyKey, set[PodKey]] = {}  # policy -> local pods listing it
        self._compiled: dict[PolicyKey, CompiledPolicy] = {}

    def _handlers(self) -> dict[type, KindHandlers[frozenset[PodKey]]]:
        store = self.store

        def shards(sets: ShardSets[Any]) -> KindHandlers[frozenset[PodKey]]:
            def put(shard: Published) -> frozenset[PodKey]:
                return self._settled({shard.info.set_key}) if sets.put(shard) else NOTHING

            def remove(shard: Published) -> frozenset[PodKey]:
                return self._settled({shard.info.set_key}) if sets.remove(shard) else NOTHING

            return KindHandlers(
                put, remove, replace=lambda objects: self._settled(sets.replace_all(objects))
            )

        return {
            Pod: KindHandlers(
                self.upsert_pod,
                lambda pod: self.delete_pod(pod.key),
                store.all_pods,
                lambda pod: pod.key,
            ),
            Service: KindHandlers(
                self._put_service,
                self._remove_service,
                replace=self._replace_services,
            ),
            PolicyShard: shards(self._policy_shards),
            AddressShard: shards(self._address_shards),
            TargetsShard: shards(self._target_shards),
        }

    def rebuilt(self) -> ShardIndex:
        """A fresh index fed what this one holds (local pods, Services, every shard),
        as a restarted agent would be: what incremental updates must equal."""
        fresh = ShardIndex(self.node_name)
        for pod in self.store.all_pods():
            fresh.upsert_pod(pod)
        fresh.replace_all(Service, list(self.store.services.values()))
        fresh.replace_all(AddressShard, self._address_shards.every_held())
        fresh.replace_all(PolicyShard, self._policy_shards.every_held())
        fresh.replace_all(TargetsShard, self._target_shards.every_held())
        return fresh

    # -- reading (the enforcer's interface) ----------------------------------------------

    def local_pods(self) -> frozenset[PodKey]:
        return frozenset(pod.key for pod in self.store.all_pods())

    def selecting_policies(self, pod: Pod) -> list[PolicyKey]:
        entry = self._entry(pod)
        return sorted(entry.policy_keys()) if entry is not None else []

    def incomplete(self, key: PodKey) -> str | None:
        """Why the pod's policy cannot be computed yet, or None."""
        pod = self.store.pod(key)
        if pod is None:
            return f"pod {key[0]}/{key[1]} is not known"
        entry = self._entry(pod)
        if entry is None:
            return (
                f"the controller has not published pod {key[0]}/{key[1]} (uid {pod.uid}) "
                f"in the PolicyTargets of node {self.node_name} yet"
            )
        for policy in entry.policy_keys():
            missing = self._missing(policy)
            if missing is not None:
                return missing
        return None

    def _entry(self, pod: Pod) -> TargetEntry | None:
        """The pod's PolicyTargets entry, only for this very pod: the same uid (an entry
        without one is nobody's)."""
        entry = self._targets.get(pod.key)
        if entry is None or not entry.uid or entry.uid != pod.uid:
            return None
        return entry

    def _missing(self, policy: PolicyKey) -> str | None:
        shard = self._policies.get(policy)
        if shard is None:
            return f"PolicyEndpoints {policy[0]}/{policy[1]} is not complete here yet"
        keys = address_sets(shard.policy)
        if len(keys) != len(shard.address_sets):
            return (
                f"PolicyEndpoints {policy[0]}/{policy[1]} names {len(shard.address_sets)} "
                f"address sets, its rules read {len(keys)} (a controller of another version?)"
            )
        for set_id in shard.address_sets:
            if set_id not in self._sets:
                return f"AddressSet {set_id} of {policy[0]}/{policy[1]} is not complete here yet"
        return None

    def compiled(self, key: PolicyKey) -> CompiledPolicy:
        compiled = self._compiled.get(key)
        if compiled is None:
            shard = self._policies[key]
            sets: dict[AddressSetKey, PublishedSet] = {
                set_key: self._sets[set_id]
                for set_key, set_id in zip(
                    address_sets(shard.policy), shard.address_sets, strict=True
                )
            }
            compiled = self._compiled[key] = compile_policy(shard.policy, PublishedPeers(sets))
        return compiled

    # -- updates ---------------------------------------------------------------------------

    def _put_service(self, service: Service) -> frozenset[PodKey]:
        self.store.services[service.key] = service
        return NOTHING

    def _remove_service(self, service: Service) -> frozenset[PodKey]:
        self.store.services.pop(service.key, None)
        return NOTHING

    def _replace_services(self, services: list[Service]) -> frozenset[PodKey]:
        self.store.services = {service.key: service for service in services}
        return NOTHING

    def upsert_pod(self, pod: Pod) -> frozenset[PodKey]:
        """A local pod (its labels, ports, uid; addresses from its endpoint)."""
        if self.store.pod(pod.key) == pod:
            return NOTHING
        self.store.put_pod(pod)
        self._resolved.pop(pod.key, None)
        return frozenset((pod.key,))

    def delete_pod(self, key: PodKey) -> frozenset[PodKey]:
        if self.store.remove_pod(key) is None:
            return NOTHING
        self._resolved.pop(key, None)
        return frozenset((key,))

    # -- complete sets in, what they change out -------------------------------------------

    def _settled(self, changed: set[SetKey]) -> frozenset[PodKey]:
        """Take in the sets whose complete version changed; the local pods affected."""
        affected: set[PodKey] = set()
        for key in changed:
            kind = key[0]
            if kind == ADDRESS_SET:
                affected |= self._address_set_changed(key)
            elif kind == POLICY_TARGETS:
                affected |= self._targets_changed()
            else:
                affected |= self._policy_changed(key)
        return self._invalidate(affected)

    def _targets_changed(self) -> set[PodKey]:
        targets: dict[PodKey, TargetEntry] = {}
        for shards in self._target_shards.completes().values():
            for shard in shards:
                if shard.info.set_name != self.node_name:
                    continue  # another node's (the watch is filtered; a label clash)
                for entry in shard.entries:
                    targets[entry.pod] = entry
        old = self._targets
        affected = {key for key in old.keys() | targets.keys() if old.get(key) != targets.get(key)}
        self._targets = targets
        listed: dict[PolicyKey, set[PodKey]] = {}
        for entry in targets.values():
            for policy in entry.policy_keys():
                listed.setdefault(policy, set()).add(entry.pod)
        self._listed = listed
        return affected

    def _policy_changed(self, key: SetKey) -> set[PodKey]:
        _, namespace, name = key
        policy = (namespace, name)
        shards = self._policy_shards.complete(key)
        old = self._policies.pop(policy, None)
        for set_id in old.address_sets if old is not None else ():
            users = self._set_users[set_id]
            users.discard(policy)
            if not users:
                del self._set_users[set_id]
        if shards is None:
            self.store.remove_policy(policy)
        else:
            self._policies[policy] = shards[0]
            self.store.put_policy(shards[0].policy)
            for set_id in shards[0].address_sets:
                self._set_users.setdefault(set_id, set()).add(policy)
        self._compiled.pop(policy, None)
        return set(self._listed.get(policy, ()))

    def _address_set_changed(self, key: SetKey) -> set[PodKey]:
        set_id = key[2]
        shards = self._address_shards.complete(key)
        old = self._set_shards.pop(set_id, None)
        if shards is None:
            self._sets.pop(set_id, None)
        else:
            self._set_shards[set_id] = shards
            self._sets[set_id] = PublishedSet(self._set_pods(set_id, old, shards))
        affected: set[PodKey] = set()
        for policy in self._set_users.get(set_id, ()):
            self._compiled.pop(policy, None)
            affected |= self._listed.get(policy, set())
        return affected

    def _set_pods(
        self,
        set_id: str,
        old: tuple[AddressShard, ...] | None,
        shards: tuple[AddressShard, ...],
    ) -> dict[PodKey, Pod]:
        """The set's pods by key. A change rewrites one shard of a set that may have
        dozens: the other shards' entries are taken over as they were. (The shards'
        Pods are shared already, one object per distinct entry: ``shards``.)"""
        current = self._sets.get(set_id)
        if current is None or old is None or len(old) != len(shards):
            return {pod.key: pod for shard in shards for pod in shard.pods}
        pods = dict(current.pods)
        for before, after in zip(old, shards, strict=True):
            if before is not after:
                for pod in before.pods:
                    pods.pop(pod.key, None)
                pods.update((pod.key, pod) for pod in after.pods)
        return pods

    # -- views -------------------------------------------------------------------------------

    def held(self, kind: str) -> dict[str, str]:
        """The objects of a kind held now, complete or not: name -> resourceVersion."""
        if kind == POLICY_ENDPOINTS:
            return self._policy_shards.versions()
        if kind == ADDRESS_SET:
            return self._address_shards.versions()
        if kind == POLICY_TARGETS:
            return self._target_shards.versions()
        raise KeyError(kind)

    def status(self) -> dict[str, int]:
        """How much of the controller's output this agent holds (for logs and tests)."""
        return {
            "policies": len(self._policies),
            "policiesHeld": len(self._policy_shards),
            "addressSets": len(self._sets),
            "addressSetsHeld": len(self._address_shards),
            "targets": len(self._targets),
        }
