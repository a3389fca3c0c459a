"""Random sequences of cluster changes, model-checked: after every step, every pod pair
on every served port is judged as the datapath would judge it (the resolver's
policies, compiled to map entries, looked up as ``bpf/policy.h`` does) and compared
with ``tests.harness.netpol_oracle``, which reads the specification and nothing of
sluice; and the resolver that took every step incrementally computes what a fresh
one computes from the final objects alone.

Both resolver modes: ``PolicyIndex`` (an agent resolving by itself) and the
controller's ``Publisher`` with each node's ``ShardIndex`` (the controller mode),
fed as watches feed them, one event at a time. Addresses come from a small pool
that hands the lowest free one out at once, so sequences also reuse addresses.

SEQUENCE_SEEDS=N (environment) runs more seeds; a failure prints the seed, the
shrunk sequence and the first wrong verdict.
"""

from __future__ import annotations

import ipaddress
import os
import random
from collections.abc import Callable
from typing import Any

import pytest

from cni.controller.publisher import Publisher
from cni.datapath.ruleset import compile_direction, digest
from cni.datapath.structs import RULE_ANY_PORT
from cni.policy.index import PolicyIndex
from cni.policy.model import KubeObject, Namespace, NetworkPolicy, Pod
from cni.policy.parse import parse_namespace, parse_pod
from cni.policy.parse_policy import read_network_policy
from cni.policy.published.index import ShardIndex
from cni.policy.published.shards import AddressShard, PolicyShard, TargetsShard
from cni.policy.vocabulary import PROTOCOLS, AllowRule, EndpointPolicy
from tests.harness.netpol_oracle import ClusterState
from tests.harness.policy_sequences import SERVED, Generator, Step, World, base_steps, shrink
from tests.harness.sequence_objects import documents, events
from tests.unit.controller.published_api import PublishedStore, publish

SEEDS = int(os.environ.get("SEQUENCE_SEEDS", "60"))
STEPS = 14
NODES = ("node-1", "node-2")
POOL = ipaddress.IPv4Network("10.244.0.0/27")

Verdict = tuple[tuple[str, str], tuple[str, str], int, str]


# -- the datapath's lookup, in Python ------------------------------------------------------


def direction_allows(
    rules: tuple[AllowRule, ...] | None, peer: str, protocol: str, port: int
) -> bool:
    """What ``policy_allows`` answers for these rules (None: not isolated)."""
    if rules is None:
        return True
    compiled = compile_direction(rules)
    address = ipaddress.IPv4Address(peer)
    matching = [net for net in compiled.peers if address in net]
    if not matching:
        return False
    peer_set = compiled.peers[max(matching, key=lambda net: net.prefixlen)]
    proto = PROTOCOLS[protocol]
    if (peer_set, proto, port) in compiled.rules:
        return True
    rule = compiled.rules.get((peer_set, proto, 0))
    if rule is not None:
        if rule.flags & RULE_ANY_PORT:
            return True
        if any(rule.ranges[i].first <= port <= rule.ranges[i].last for i in range(rule.nranges)):
            return True
    return (peer_set, 0, 0) in compiled.rules


def parse(document: dict[str, Any]) -> KubeObject:
    kind = document["kind"]
    if kind == "Namespace":
        return parse_namespace(document)
    if kind == "Pod":
        return parse_pod(document)
    return read_network_policy(document)


# -- the two resolver modes, fed one event at a time ----------------------------------------


class AgentMode:
    """An agent resolving by itself; every pod is on its node."""

    def __init__(self) -> None:
        self.index = PolicyIndex("node-1")

    def node_of(self, key: tuple[str, str]) -> str:
        return "node-1"

    def feed(self, verb: str, obj: KubeObject) -> None:
        (self.index.delete if verb == "delete" else self.index.upsert)(obj)

    def settle(self) -> None:
        pass

    def policies(self) -> dict[tuple[str, str], EndpointPolicy]:
        return {key: self.index.resolve(key).endpoint for key in self.index.local_pods()}

    @staticmethod
    def fresh(objects: list[KubeObject]) -> dict[tuple[str, str], EndpointPolicy]:
        index = PolicyIndex("node-1")
        for obj in objects:
            index.upsert(obj)
        return {key: index.resolve(key).endpoint for key in index.local_pods()}


class ControllerMode:
    """The controller publishing, one agent per node reading its shards as watch
    events (each a delete or an upsert of one object)."""

    def __init__(self) -> None:
        self.publisher = Publisher(capacity=4, targets_capacity=4)
        self.store = PublishedStore()
        self.agents = {node: ShardIndex(node) for node in NODES}
        self.held: dict[str, dict[tuple[type, str], Any]] = {node: {} for node in NODES}
        self.generation = 1
        self.pods: dict[tuple[str, str], Pod] = {}

    def node_of(self, key: tuple[str, str]) -> str:
        return NODES[sum(map(ord, key[1])) % 2]  # a, c on one node; b, d on the other

    def feed(self, verb: str, obj: KubeObject) -> None:
        self.generation += 1
        publisher = self.publisher
        if isinstance(obj, Pod):
            agent = self.agents[obj.node_name]
            if verb == "delete":
                publisher.remove_pod(obj.key)
                agent.delete_pod(obj.key)
                self.pods.pop(obj.key, None)
            else:
                publisher.put_pod(obj)
                agent.upsert_pod(obj)  # the agent's own endpoint
                self.pods[obj.key] = obj
        elif isinstance(obj, Namespace):
            if verb == "delete":
                publisher.remove_namespace(obj.name)
            else:
                publisher.put_namespace(obj)
        elif isinstance(obj, NetworkPolicy):
            if verb == "delete":
                publisher.remove_policy(obj.key)
            else:
                publisher.put_policy(obj, f"uid-{obj.namespace}-{obj.name}", self.generation)

    def settle(self) -> None:
        publish(self.publisher, self.store)
        for node, agent in self.agents.items():
            policies, sets, targets = self.store.for_node(node)
            now = {
                **{(AddressShard, s.info.name): s for s in sets},
                **{(PolicyShard, s.info.name): s for s in policies},
                **{(TargetsShard, s.info.name): s for s in targets},
            }
            before = self.held[node]
            for key, shard in before.items():
                if key not in now:
                    agent.delete(shard)
            for key, shard in now.items():
                if before.get(key) != shard:
                    agent.upsert(shard)
            self.held[node] = now

    def policies(self) -> dict[tuple[str, str], EndpointPolicy]:
        out = {}
        for agent in self.agents.values():
            for key in agent.local_pods():
                out[key] = agent.resolve(key).endpoint
        return out

    def fresh(self, objects: list[KubeObject]) -> dict[tuple[str, str], EndpointPolicy]:
        publisher = Publisher(capacity=4, targets_capacity=4)
        store = PublishedStore()
        for obj in objects:
            if isinstance(obj, Pod):
                publisher.put_pod(obj)
            elif isinstance(obj, Namespace):
                publisher.put_namespace(obj)
            elif isinstance(obj, NetworkPolicy):
                publisher.put_policy(obj, f"uid-{obj.namespace}-{obj.name}", 1)
        publisher.recompute_everything()
        publish(publisher, store)
        out = {}
        for node in NODES:
            agent = ShardIndex(node)
            for obj in objects:
                if isinstance(obj, Pod) and obj.node_name == node:
                    agent.upsert_pod(obj)
            store.feed(agent)
            for key in agent.local_pods():
                out[key] = agent.resolve(key).endpoint
        return out


MODES: dict[str, Callable[[], Any]] = {"agent": AgentMode, "controller": ControllerMode}


# -- one sequence ---------------------------------------------------------------------------


def allocate(world: World) -> str:
    taken = {pod.ip for pod in world.pods.values()}
    for address in POOL.hosts():
        if str(address) not in taken and address != POOL.network_address + 1:
            return str(address)
    raise AssertionError("the test pool is full")


def wrong_verdicts(world: World, policies: dict[tuple[str, str], EndpointPolicy]) -> list[str]:
    state: ClusterState = world.oracle_state()
    wrong = []
    for (source, destination, port, protocol), want in sorted(state.table(SERVED).items()):
        src, dst = state.pods[source], state.pods[destination]
        got = direction_allows(
            policies[source].egress, dst.ip, protocol, port
        ) and direction_allows(policies[destination].ingress, src.ip, protocol, port)
        if got != want:
            wrong.append(
                f"{'/'.join(source)} ({src.ip}) -> {'/'.join(destination)} ({dst.ip}) "
                f"{protocol}/{port}: sluice {'allows' if got else 'denies'}, the oracle "
                f"{'allows' if want else 'denies'}"
            )
    return wrong


def digests(
    policies: dict[tuple[str, str], EndpointPolicy],
) -> dict[tuple[str, str], tuple[bytes | None, bytes | None]]:
    def one(rules: tuple[AllowRule, ...] | None) -> bytes | None:
        return None if rules is None else digest(compile_direction(rules))

    return {key: (one(p.ingress), one(p.egress)) for key, p in policies.items()}


def base_world() -> World:
    """The base state the generator starts from (addresses as ``run`` hands them out)."""
    world = World()
    for step in base_steps():
        for effect in world.effects(step):
            new_pod = effect["op"] == "pod" and (effect["ns"], effect["pod"]) not in world.pods
            ips = {(effect["ns"], effect["pod"]): allocate(world)} if new_pod else None
            world.apply(effect, ips)
    return world


def run(mode_name: str, steps: list[Step]) -> str | None:
    """Play ``steps`` after the base state; the first problem found, or None."""
    mode = MODES[mode_name]()
    world = World()
    for number, step in enumerate(base_steps() + steps):
        before = documents(world, mode.node_of)
        for effect in world.effects(step):
            new_pod = effect["op"] == "pod" and (effect["ns"], effect["pod"]) not in world.pods
            ips = {(effect["ns"], effect["pod"]): allocate(world)} if new_pod else None
            world.apply(effect, ips)
        after = documents(world, mode.node_of)
        for verb, document in events(before, after):
            mode.feed(verb, parse(document))
        mode.settle()
        if number < len(base_steps()) - 1:
            continue
        policies = mode.policies()
        assert set(policies) == {(world.real(ns), name) for ns, name in world.pods}
        wrong = wrong_verdicts(world, policies)
        if wrong:
            where = f"after step {number - len(base_steps()) + 1} {step}"
            return f"{where}: {wrong[0]} ({len(wrong)} wrong)"
        fresh = mode.fresh([parse(document) for document in after.values()])
        if digests(fresh) != digests(policies):
            differing = sorted(k for k in fresh if digests(fresh)[k] != digests(policies).get(k))
            where = f"after step {number - len(base_steps()) + 1} {step}"
            return f"{where}: incremental differs from a fresh resolver for {differing}"
    return None


@pytest.mark.parametrize("mode", sorted(MODES))
def test_random_sequences_match_the_oracle(mode: str) -> None:
    steps_run = 0
    for seed in range(SEEDS):
        steps = Generator(random.Random(seed)).sequence(base_world(), STEPS)
        problem = run(mode, steps)
        steps_run += len(steps)
        if problem is not None:
            minimal = shrink(steps, lambda candidate: run(mode, candidate) is not None, budget=200)
            pytest.fail(
                f"{mode} mode, seed {seed}: {problem}\nshrunk to {len(minimal)} steps: "
                f"{minimal}\n{run(mode, minimal)}"
            )
    print(f"{mode} mode: {SEEDS} sequences, {steps_run} steps, every verdict as the oracle's")


def test_the_world_keeps_policy_types_as_server_side_apply_does() -> None:
    """Measured on the API server (v1.34, ``kubectl apply --server-side``): policyTypes
    defaulted at creation belong to no field manager and survive an apply that omits
    them, even when the new rules would default otherwise; policyTypes the applier
    listed go with the next apply that omits them, and are defaulted afresh."""
    world = World()
    for step in base_steps():
        world.apply(step)
    egress = {"podSelector": {}, "egress": [{"to": [{"podSelector": {}}]}]}
    ingress_only = {"podSelector": {}, "ingress": [], "egress": []}
    world.apply({"op": "policy", "ns": "x", "name": "p", "spec": egress})
    world.apply({"op": "policy", "ns": "x", "name": "p", "spec": ingress_only})
    assert world.policies[("x", "p")]["policyTypes"] == ["Ingress", "Egress"]

    listed = {**egress, "policyTypes": ["Egress"]}
    world.apply({"op": "policy", "ns": "x", "name": "q", "spec": listed})
    world.apply({"op": "policy", "ns": "x", "name": "q", "spec": ingress_only})
    assert world.policies[("x", "q")]["policyTypes"] == ["Ingress"]

    world.apply({"op": "delete-policy", "ns": "x", "name": "p"})
    world.apply({"op": "policy", "ns": "x", "name": "p", "spec": ingress_only})
    assert world.policies[("x", "p")]["policyTypes"] == ["Ingress"]
