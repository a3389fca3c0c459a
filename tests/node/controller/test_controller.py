"""The central resolver against a real API server (a control plane with nodes that no
kubelet runs): what ``sluicectl controller`` publishes, and what agents started with
``--resolver controller`` make of it, next to agents that resolve on their own.

Agents here are the agent's real sources and enforcer with a datapath that records
installs (``tests.harness.simulated_agent``).
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from cni.agent.enforcer import NotReady
from cni.controller.controller import Controller
from cni.controller.sharding import placement_hash, shard_count
from cni.kube.api import Api, Gone
from cni.kube.informer import Informer
from cni.policy.index import PolicyIndex
from cni.policy.model import (
    NAMESPACE_NAME_LABEL,
    ContainerPort,
    IPBlock,
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PolicyPort,
    PolicyRule,
    labels_of,
)
from cni.policy.parse import parse_pod
from cni.policy.published.identity import shard_info
from cni.policy.published.names import (
    ADDRESS_SET,
    NODE_LABEL_PREFIX,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    address_set_id,
    address_set_name,
    collection_path,
    object_path,
    policy_targets_name,
)
from cni.policy.published.render import (
    address_set_object,
    policy_endpoints_object,
    policy_targets_object,
)
from cni.policy.published.sets import AddressSetKey
from cni.policy.published.shards import TargetEntry, parse_policy_targets
from cni.policy.selectors import PodGroup, target_group
from tests.harness.cluster import Cluster
from tests.harness.controller import (
    ControllerProcess,
    lease_holder,
    published,
    settled,
    versions,
)
from tests.harness.k8s_objects import create_world, pod_path
from tests.harness.simulated_agent import SimulatedAgent, recorded_installs
from tests.harness.waiting import eventually

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

SHARD_SIZE = 4
TARGETS_SHARD_SIZE = 5
APPS = {
    "web": (ContainerPort("http", 8080),),
    "api": (ContainerPort("http", 8080), ContainerPort("metrics", 9090)),
    "db": (ContainerPort("pg", 5432),),
}


def select(**labels: str) -> LabelSelector:
    return LabelSelector(labels_of(labels))


@dataclass
class World:
    prefix: str
    nodes: list[str]
    namespaces: list[Namespace]
    pods: list[Pod]
    policies: list[NetworkPolicy]

    def index(self) -> PolicyIndex:
        index = PolicyIndex()
        for obj in (*self.namespaces, *self.pods, *self.policies):
            index.upsert(obj)
        return index

    def on(self, node: str) -> list[Pod]:
        return [pod for pod in self.pods if pod.node_name == node and not pod.host_network]


def make_world(prefix: str, pods_per_namespace: int = 24) -> World:
    """Two namespaces (teams a and b), three nodes, web/api/db pods with named ports,
    and policies of every kind of rule: named ports both ways, cross-namespace
    selectors, ipBlock with except, a named port looked up on every pod."""
    net = random.Random(prefix).randrange(100, 200)
    nodes = [f"{prefix}-n{i}" for i in range(3)]
    a, b = f"{prefix}-a", f"{prefix}-b"
    namespaces = [
        Namespace(name, labels_of({"team": team, NAMESPACE_NAME_LABEL: name}))
        for name, team in ((a, "a"), (b, "b"))
    ]
    pods = []
    for n, namespace in enumerate((a, b)):
        for i in range(pods_per_namespace):
            app = ("web", "api", "db")[i % 3]
            pods.append(
                Pod(
                    namespace,
                    f"{app}-{i}",
                    labels_of({"app": app}),
                    (f"10.{net}.{n}.{i + 1}",),
                    nodes[i // 3 % 3],  # every app on every node
                    APPS[app],
                )
            )
    policies = [
        NetworkPolicy(a, "deny-ingress", LabelSelector(), ("Ingress",)),
        NetworkPolicy(
            a,
            "web-to-api",
            select(app="api"),
            ingress=(
                PolicyRule((Peer(pod_selector=select(app="web")),), (PolicyPort("TCP", "http"),)),
            ),
        ),
        NetworkPolicy(
            a,
            "api-to-db",
            select(app="api"),
            ("Egress",),
            egress=(
                PolicyRule(
                    (Peer(pod_selector=select(app="db"), namespace_selector=select(team="b")),),
                    (PolicyPort("TCP", "pg"),),
                ),
            ),
        ),
        NetworkPolicy(
            a,
            "web-to-cidr",
            select(app="web"),
            ("Egress",),
            egress=(
                PolicyRule(
                    (Peer(ip_block=IPBlock("10.0.0.0/8", (f"10.{net}.1.0/24",))),),
                    (PolicyPort("TCP", 443),),
                ),
            ),
        ),
        NetworkPolicy(
            a,
            "metrics-anywhere",
            select(app="web"),
            ("Egress",),
            egress=(PolicyRule((), (PolicyPort("TCP", "metrics"),)),),
        ),
        NetworkPolicy(
            b,
            "db-from-everywhere",
            select(app="db"),
            ingress=(PolicyRule((Peer(namespace_selector=LabelSelector()),)),),
        ),
    ]
    return World(prefix, nodes, namespaces, pods, policies)


@pytest.fixture
def api(k8s_control_plane: Cluster) -> Iterator[Api]:
    client = Api(str(k8s_control_plane.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def prefix(k8s_control_plane: Cluster) -> Iterator[str]:
    """A name for the test's objects; everything of the test is deleted afterwards."""
    name = f"w{uuid.uuid4().hex[:6]}"
    yield name
    cluster = k8s_control_plane
    namespaces = [f"{name}-a", f"{name}-b", f"{name}-p"]
    for namespace in namespaces:
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force",
            "--ignore-not-found", check=False, timeout=120,
        )  # fmt: skip
    # Pods are gone already; the namespaces need not be waited for (names are unique).
    cluster.kubectl("delete", "namespace", "--ignore-not-found", "--wait=false", *namespaces)
    nodes = cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    mine = [n for n in nodes if n.startswith(f"node/{name}-")]
    if mine:
        cluster.kubectl("delete", *mine)
    cluster.kubectl("delete", "policyendpoints,addresssets,policytargets", "--all")
    cluster.kubectl("delete", "leases", "-n", "default", "--all")


@pytest.fixture
def installs() -> Iterator[None]:
    with recorded_installs():
        yield


@pytest.fixture
def controllers(k8s_control_plane: Cluster, tmp_path: Path) -> Iterator[list[ControllerProcess]]:
    """Controller processes a test starts (``start_controller``); all stopped afterwards."""
    started: list[ControllerProcess] = []
    yield started
    for process in started:
        process.kill()


def start_controller(
    cluster: Cluster, started: list[ControllerProcess], tmp_path: Path, identity: str
) -> ControllerProcess:
    process = ControllerProcess(
        cluster.kubeconfig_for("sluice-controller"),
        tmp_path / f"{identity}.log",
        identity,
        "sluice-controller-test",
        f"--shard-size={SHARD_SIZE}",
        f"--targets-shard-size={TARGETS_SHARD_SIZE}",
    )
    started.append(process)
    return process.start()


@pytest.fixture
def agents(api: Api, installs: None) -> Iterator[list[SimulatedAgent]]:
    running: list[SimulatedAgent] = []
    yield running
    for agent in running:
        agent.stop()


def start_agents(
    kubeconfig: Path, running: list[SimulatedAgent], world: World, resolver: str
) -> dict[str, SimulatedAgent]:
    """One agent per node of the world, each wiring its node's pods."""
    out = {}
    for node in world.nodes:
        agent = SimulatedAgent(Api(str(kubeconfig)), node, resolver)
        running.append(agent)
        agent.start()
        out[node] = agent
    for node, agent in out.items():
        agent.wait_ready()
        for pod in world.on(node):
            agent.wire(pod.key, pod.ips)
    return out


def assert_same_policies(
    world: World, by_controller: dict[str, SimulatedAgent], by_agent: dict[str, SimulatedAgent]
) -> bool:
    for node in world.nodes:
        for pod in world.on(node):
            mine, theirs = by_controller[node].policy_of(pod.key), by_agent[node].policy_of(pod.key)
            assert mine == theirs, f"{pod.key} on {node}: {mine} != {theirs}"
    return True


def shards_by_set(found: dict[tuple[str, str], dict[str, Any]], kind: str) -> dict:
    sets: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for (k, _), obj in found.items():
        if k == kind:
            info = shard_info(obj)
            sets.setdefault((info.set_namespace, info.set_name), []).append(obj)
    return sets


def test_published_objects_are_complete_bounded_owned_and_resolve_like_an_agent(
    k8s_control_plane: Cluster,
    api: Api,
    prefix: str,
    controllers: list[ControllerProcess],
    agents: list[SimulatedAgent],
    tmp_path: Path,
) -> None:
    world = make_world(prefix)
    create_world(api, world.nodes, world.namespaces, world.pods, world.policies)
    start_controller(k8s_control_plane, controllers, tmp_path, "leader")
    kubeconfig = k8s_control_plane.kubeconfig
    by_controller = start_agents(kubeconfig, agents, world, "controller")
    by_agent = start_agents(kubeconfig, agents, world, "agent")
    eventually(
        lambda: assert_same_policies(world, by_controller, by_agent),
        "agents resolving through the controller install what agents resolving alone do",
    )
    isolated = [
        pod
        for node in world.nodes
        for pod in world.on(node)
        if by_controller[node].policy_of(pod.key).ingress is not None  # type: ignore[union-attr]
    ]
    assert isolated, "the world's policies isolate no pod: the comparison proves nothing"

    found = published(api)
    index = world.index()
    # PolicyEndpoints: one per policy, named after it, recording its uid and generation.
    for policy in world.policies:
        key = (POLICY_ENDPOINTS, f"{policy.namespace}.{policy.name}")
        assert key in found, f"no PolicyEndpoints for {policy.key}"
        body = found[key]
        source = api.get(
            f"/apis/networking.k8s.io/v1/namespaces/{policy.namespace}"
            f"/networkpolicies/{policy.name}"
        )
        assert source is not None
        spec = body["spec"]
        assert (spec["policyNamespace"], spec["policyName"], spec["policyUID"]) == (
            policy.namespace,
            policy.name,
            source["metadata"]["uid"],
        )
        assert "ownerReferences" not in body["metadata"]  # none is valid (cluster-scoped)
        assert body["spec"]["policyGeneration"] == source["metadata"]["generation"]
        assert (body["spec"]["shardIndex"], body["spec"]["shardCount"]) == (0, 1)
        # Labelled with exactly the nodes hosting a pod it selects.
        selected = index.groups.members(target_group(policy))
        nodes = {pod.node_name for pod in world.pods if pod.key in selected}
        labelled = {
            k.removeprefix(NODE_LABEL_PREFIX)
            for k in body["metadata"]["labels"]
            if k.startswith(NODE_LABEL_PREFIX)
        }
        assert labelled == nodes, policy.key
        for set_id in body["spec"]["addressSets"]:
            assert ("", set_id) in shards_by_set(found, ADDRESS_SET), set_id
    # AddressSets and PolicyTargets: complete and bounded.
    for kind, bound in ((ADDRESS_SET, SHARD_SIZE), (POLICY_TARGETS, TARGETS_SHARD_SIZE)):
        for set_key, shards in shards_by_set(found, kind).items():
            infos = [shard_info(shard) for shard in shards]
            (count,) = {info.count for info in infos}
            assert sorted(info.index for info in infos) == list(range(count)), set_key
            assert all(len(shard["spec"]["pods"]) <= bound for shard in shards), set_key
    listed = {
        entry.pod
        for (kind, _), body in found.items()
        if kind == POLICY_TARGETS
        for entry in parse_policy_targets(body).entries
    }
    assert listed == {pod.key for pod in world.pods}


def test_a_pod_label_change_rewrites_one_shard_of_each_set_it_moves_in(
    k8s_control_plane: Cluster,
    api: Api,
    prefix: str,
    controllers: list[ControllerProcess],
    tmp_path: Path,
) -> None:
    world = make_world(prefix)
    create_world(api, world.nodes, world.namespaces, world.pods, world.policies)
    start_controller(k8s_control_plane, controllers, tmp_path, "leader")
    a = world.namespaces[0].name
    web_set = address_set_id(AddressSetKey(PodGroup(a, None, select(app="web"))))

    def in_a(pod: Pod, app: str) -> bool:
        return pod.namespace == a and pod.name.startswith(app)

    def web_set_members() -> set[str]:
        return {
            entry["pod"]
            for (kind, _), body in published(api).items()
            if kind == ADDRESS_SET and body["spec"]["setID"] == web_set
            for entry in body["spec"]["pods"]
        }

    webs = {pod_name(p) for p in world.pods if in_a(p, "web")}
    eventually(lambda: web_set_members() == webs, "the web pods published")
    shards = [k for k in published(api) if k[0] == ADDRESS_SET and k[1].startswith(web_set)]
    assert len(shards) > 1, f"the set must span several shards for this test: {shards}"
    before = settled(api)

    # A web pod becomes an api pod (it leaves the web set), or an api pod a web pod (it
    # joins it). No policy selects it any more or less (web and api pods are both
    # selected by deny-ingress, and web-to-api's targets are api pods on every node
    # already). The pod is one whose move keeps the web set's shard count: a set that
    # must double or halve rewrites every shard, by design, and whether a given pod
    # tips it depends on the hashes of this run's random names.
    moved, app, members = next(
        (pod, app, after)
        for pod, app, after in (
            *((p, "api", webs - {pod_name(p)}) for p in world.pods if in_a(p, "web")),
            *((p, "web", webs | {pod_name(p)}) for p in world.pods if in_a(p, "api")),
        )
        if keeps_shard_count(webs, after)
    )
    api.patch(pod_path(a, moved.name), {"metadata": {"labels": {"app": app}}})
    eventually(lambda: web_set_members() == members, "the web set updated")
    after = settled(api)

    changed = [key for key in after if before.get(key) != after[key]]
    assert not [key for key in before if key not in after], "an object was deleted"
    per_set = Counter(
        shard_info(published(api)[key]).set_name for key in changed if key[0] == ADDRESS_SET
    )
    assert per_set[web_set] == 1, changed
    assert all(n == 1 for n in per_set.values()), per_set
    others = [key for key in changed if key[0] != ADDRESS_SET]
    targets = [key for key in others if key[0] == POLICY_TARGETS]
    assert [key for key in others if key[0] == POLICY_ENDPOINTS] == [], others
    assert len(targets) <= 1 and all(key[1].startswith(moved.node_name) for key in targets)


def pod_name(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}"


def keeps_shard_count(members: set[str], after: set[str]) -> bool:
    """Whether a set of ``members``, sharded from scratch, keeps its shard count when its
    members become ``after`` (``cni.controller.sharding``, at the test's shard size)."""
    current = shard_count([placement_hash(m) for m in members], SHARD_SIZE)
    return shard_count([placement_hash(m) for m in after], SHARD_SIZE, current) == current


def write(api: Api, body: dict[str, Any]) -> str:
    """Create or replace a published object by hand; its new resourceVersion."""
    kind, name = body["kind"], body["metadata"]["name"]
    current = api.get(object_path(kind, name))
    if current is None:
        stored = api.create(collection_path(kind), body)
    else:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        stored = api.replace(object_path(kind, name), body)
    return str(stored["metadata"]["resourceVersion"])


def test_an_agent_never_applies_a_partial_set(
    k8s_control_plane: Cluster, api: Api, prefix: str, agents: list[SimulatedAgent]
) -> None:
    """No controller: the objects are written by hand, one shard at a time."""
    node, namespace = f"{prefix}-n0", f"{prefix}-p"
    target = Pod(namespace, "target", labels_of({"app": "t"}), ("10.9.0.1",), node)
    create_world(api, [node], [Namespace(namespace, labels_of({NAMESPACE_NAME_LABEL: namespace}))])
    create_world(api, pods=[target])
    uid = api.get(pod_path(namespace, "target"))["metadata"]["uid"]  # type: ignore[index]
    peer_group = PodGroup(namespace, None, select(app="peer"))
    other_group = PodGroup(namespace, None, select(app="other"))

    def peers(first: int, last: int) -> list[Pod]:
        return [Pod(namespace, f"p{i:02}", ips=(f"10.9.1.{i}",)) for i in range(first, last + 1)]

    def set_shards(key: AddressSetKey, pods: list[Pod], count: int) -> list[dict[str, Any]]:
        return [
            address_set_object(
                key, i, count, [p for p in pods if int(p.name[1:]) % count == i], [node]
            )
            for i in range(count)
        ]

    def policy(groups: list[PodGroup]) -> NetworkPolicy:
        rules = tuple(PolicyRule((Peer(pod_selector=g.pod_selector),)) for g in groups)
        return NetworkPolicy(namespace, "allow", select(app="t"), (), rules)

    # A real policy: its PolicyEndpoints name its uid.
    create_world(api, policies=[policy([peer_group])])
    owner = api.get(f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/allow")
    assert owner is not None

    def endpoints(generation: int, groups: list[PodGroup]) -> dict[str, Any]:
        ids = [address_set_id(AddressSetKey(g)) for g in groups]
        return policy_endpoints_object(
            policy(groups), owner["metadata"]["uid"], generation, ids, [node]
        )

    def allowed(agent: SimulatedAgent) -> set[str]:
        installed = agent.policy_of(target.key)
        assert installed is not None and installed.ingress is not None
        return {peer.cidr for rule in installed.ingress for peer in rule.peers}

    def cidrs(pods: list[Pod]) -> set[str]:
        return {f"{p.ips[0]}/32" for p in pods}

    peer_key = AddressSetKey(peer_group)
    for body in set_shards(peer_key, peers(1, 4), 2):
        write(api, body)
    write(api, endpoints(1, [peer_group]))
    write(
        api,
        policy_targets_object(node, 0, 1, [TargetEntry(target.key, uid, ("allow",))]),
    )
    agent = SimulatedAgent(Api(str(k8s_control_plane.kubeconfig)), node, "controller")
    agents.append(agent)
    agent.start()
    agent.wait_ready()
    agent.wire(target.key, target.ips)
    first = cidrs(peers(1, 4))
    assert allowed(agent) == first

    def seen(kind: str, version: str) -> bool:
        with agent.enforcer.lock:
            return version in agent.enforcer.index.held(kind).values()  # type: ignore[attr-defined]

    def write_and_check(body: dict[str, Any], expected: set[str]) -> None:
        version = write(api, body)
        eventually(lambda: seen(body["kind"], version), f"the agent holds {body['kind']}")
        agent.enforcer.enforce_now(list(agent.enforcer.endpoints))
        assert allowed(agent) == expected, body["metadata"]["name"]

    # The set is resharded (2 -> 3) with more pods, one shard at a time.
    second = cidrs(peers(1, 6))
    new_shards = set_shards(peer_key, peers(1, 6), 3)
    for body in new_shards[:-1]:
        write_and_check(body, first)
    write_and_check(new_shards[-1], second)

    # A new generation of the policy reads a set that is not written yet: kept as it was.
    other_key = AddressSetKey(other_group)
    others = [replace(p, name=f"p{int(p.name[1:]) + 50:02}") for p in peers(1, 3)]
    write_and_check(endpoints(2, [peer_group, other_group]), second)
    other_shards = set_shards(other_key, others, 2)
    write_and_check(other_shards[0], second)
    write_and_check(other_shards[1], second | cidrs(others))

    # A shard that goes missing removes nothing.
    api.delete(object_path(ADDRESS_SET, other_shards[0]["metadata"]["name"]))
    threading.Event().wait(1)
    agent.enforcer.enforce_now(list(agent.enforcer.endpoints))
    assert allowed(agent) == second | cidrs(others)

    # Nothing but complete sets was ever installed.
    expected = [first, second, second | cidrs(others)]
    for install in agent.datapath.installs:
        assert install.policy.ingress is not None
        assert {p.cidr for r in install.policy.ingress for p in r.peers} in expected


def test_leader_election_one_leads_a_standby_takes_over_and_deletes_nothing(
    k8s_control_plane: Cluster,
    api: Api,
    prefix: str,
    controllers: list[ControllerProcess],
    tmp_path: Path,
) -> None:
    world = make_world(prefix, pods_per_namespace=12)
    create_world(api, world.nodes, world.namespaces, world.pods, world.policies)
    first = start_controller(k8s_control_plane, controllers, tmp_path, "first")
    eventually(lambda: lease_holder(api) == "first", "the first controller leads")
    eventually(lambda: first.said("published"), "the first controller publishes")
    eventually(
        lambda: len([k for k in published(api) if k[0] == POLICY_ENDPOINTS]) == len(world.policies),
        "every policy published",
    )
    before = settled(api)

    second = start_controller(k8s_control_plane, controllers, tmp_path, "second")
    third = start_controller(k8s_control_plane, controllers, tmp_path, "third")
    eventually(lambda: second.said("listed") and third.said("listed"), "the standbys watch")
    threading.Event().wait(3)
    assert lease_holder(api) == "first"
    assert not second.said("leading:") and not third.said("leading:")

    # A clean stop gives the lease up: a standby takes over at its next try.
    first.stop()
    assert first.said("released lease")
    new = eventually(
        lambda: {"second": second, "third": third}.get(lease_holder(api)), "a standby leads"
    )
    eventually(lambda: new.said("term"), "the new leader plans")
    threading.Event().wait(2)
    assert versions(api) == before, "the new leader rewrote or deleted objects"

    # A crash keeps the lease until it expires; then the last standby takes over.
    last = third if new is second else second
    new.kill()
    eventually(lambda: lease_holder(api) == last.identity, "the last standby leads", timeout=30)
    eventually(lambda: last.said("term"), "the last leader plans")
    threading.Event().wait(2)
    assert versions(api) == before, "the last leader rewrote or deleted objects"
    assert not [m for m in last.messages() if "deleted" in m]


class GatedApi(Api):
    """An API whose pod list waits until ``gate`` opens: a cache that has not synced."""

    def __init__(self, kubeconfig: str, gate: threading.Event) -> None:
        super().__init__(kubeconfig)
        self.gate = gate
        self.writes: list[str] = []

    def pages(self, path: str, **params: str):  # type: ignore[no-untyped-def]
        if path == "/api/v1/pods":
            self.gate.wait()
        return super().pages(path, **params)

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method != "GET" and "/sluice.dev/" in path:
            self.writes.append(f"{method} {path}")
        return super()._json(method, path, **kwargs)


def test_a_restarted_controller_deletes_nothing_before_its_caches_sync(
    k8s_control_plane: Cluster,
    api: Api,
    prefix: str,
    controllers: list[ControllerProcess],
    tmp_path: Path,
) -> None:
    world = make_world(prefix, pods_per_namespace=12)
    create_world(api, world.nodes, world.namespaces, world.pods, world.policies)
    first = start_controller(k8s_control_plane, controllers, tmp_path, "first")
    eventually(
        lambda: len([k for k in published(api) if k[0] == POLICY_ENDPOINTS]) == len(world.policies),
        "every policy published",
    )
    settled(api)
    first.stop()
    # An object of no policy, which a synced controller must sweep.
    orphan = address_set_object(
        AddressSetKey(PodGroup(f"{prefix}-a", None, select(app="gone"))), 0, 1, [], []
    )
    api.create(collection_path(ADDRESS_SET), orphan)
    before = versions(api)

    gate = threading.Event()
    gated = GatedApi(str(k8s_control_plane.kubeconfig_for("sluice-controller")), gate)
    restarted = Controller(
        gated,
        lease_namespace="default",
        lease_name="sluice-controller-test",
        identity="restarted",
        capacity=SHARD_SIZE,
        targets_capacity=TARGETS_SHARD_SIZE,
        lease=4,
        renew_deadline=3,
        retry=0.5,
    )
    stopping = threading.Event()
    runner = threading.Thread(target=restarted.run, args=(stopping,), daemon=True)
    runner.start()
    try:
        eventually(lambda: restarted.leading, "the restarted controller leads")
        threading.Event().wait(3)  # leading, every collection but pods listed
        assert restarted.unsynced() == ["pods"]
        assert gated.writes == [], "written before the caches synced"
        assert versions(api) == before
        gate.set()
        orphan_key = (ADDRESS_SET, orphan["metadata"]["name"])
        eventually(lambda: orphan_key not in published(api), "the orphan swept once synced")
        threading.Event().wait(1)
        assert [w for w in gated.writes if not w.endswith(orphan["metadata"]["name"])] == []
        after = versions(api)
        del before[orphan_key]
        assert after == before, "a synced controller rewrote or deleted what was right"
    finally:
        gate.set()
        stopping.set()
        runner.join(timeout=30)
        gated.close()


class PodSink:
    """What an informer hands over: whole lists and single events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lists = 0
        self.names: set[str] = set()

    def replace(self, kind: str, objects: list[Any]) -> None:
        with self.lock:
            self.lists += 1
            self.names = {pod.name for pod in objects}

    def change(self, kind: str, event: str, obj: Any) -> None:
        with self.lock:
            if event == "DELETED":
                self.names.discard(obj.name)
            else:
                self.names.add(obj.name)


class CompactedWatchApi(Api):
    """A real API whose first watch is answered as a server answers a watch from a
    resourceVersion it no longer holds (an ERROR event with code 410), and which
    records the parameters of every list.

    The answer is injected: within a test's time the server cannot be made to give
    it, as its watch cache keeps every event of the last 75 s (a watch from
    resourceVersion 1 of a fresh control plane replays its history instead)."""

    def __init__(self, kubeconfig: str) -> None:
        super().__init__(kubeconfig)
        self.list_params: list[dict[str, str]] = []
        self.gone = 0

    def pages(self, path: str, **params: str):  # type: ignore[no-untyped-def]
        self.list_params.append(dict(params))
        return super().pages(path, **params)

    def watch(self, path: str, resource_version: str, **params: str):  # type: ignore[no-untyped-def]
        if not self.gone:
            self.gone += 1
            raise Gone(410, f"too old resource version: {resource_version}")
        return super().watch(path, resource_version, **params)


def test_an_informer_lists_from_the_watch_cache_and_lists_again_after_410(
    k8s_control_plane: Cluster, api: Api, prefix: str
) -> None:
    node, namespace = f"{prefix}-n0", f"{prefix}-p"
    create_world(api, [node], [Namespace(namespace, labels_of({NAMESPACE_NAME_LABEL: namespace}))])
    create_world(api, pods=[Pod(namespace, "first", ips=("10.9.2.1",), node_name=node)])
    sink = PodSink()
    watching = CompactedWatchApi(str(k8s_control_plane.kubeconfig))
    informer = Informer(watching, "pods", f"/api/v1/namespaces/{namespace}/pods", parse_pod, sink)
    informer.start()
    try:
        eventually(lambda: watching.gone == 1 and sink.lists == 2, "a 410, then a second list")
        assert sink.names == {"first"}
        # The first list from the cache as it is; the second never older than the first.
        first, second = watching.list_params[:2]
        assert first["resourceVersion"] == "0"
        assert second["resourceVersionMatch"] == "NotOlderThan"
        assert int(second["resourceVersion"]) >= 1
        create_world(api, pods=[Pod(namespace, "second", ips=("10.9.2.2",), node_name=node)])
        eventually(lambda: sink.names == {"first", "second"}, "the watch resumed after the list")
        assert sink.lists == 2
    finally:
        informer.stop()
        watching.close()


def test_only_the_controllers_objects_count(
    k8s_control_plane: Cluster,
    api: Api,
    prefix: str,
    controllers: list[ControllerProcess],
    agents: list[SimulatedAgent],
    tmp_path: Path,
) -> None:
    """Objects of sluice's kinds that the controller did not write, as a writer whom
    RBAC and the admission policy let through (here: an administrator, with neither
    installed) would make them: a shard under another name shadows no real shard and
    the controller deletes it; a PolicyTargets entry without a uid matches no pod."""
    node, namespace = f"{prefix}-n0", f"{prefix}-p"
    peers = [Pod(namespace, f"peer{i}", labels_of({"app": "peer"}), (f"10.9.3.{i}",), node)
             for i in (1, 2)]  # fmt: skip
    target = Pod(namespace, "target", labels_of({"app": "t"}), ("10.9.4.1",), node)
    rule = PolicyRule((Peer(pod_selector=select(app="peer")),))
    create_world(
        api,
        [node],
        [Namespace(namespace, labels_of({NAMESPACE_NAME_LABEL: namespace}))],
        [*peers, target],
        [NetworkPolicy(namespace, "allow", select(app="t"), (), (rule,))],
    )
    start_controller(k8s_control_plane, controllers, tmp_path, "leader")
    agent = SimulatedAgent(Api(str(k8s_control_plane.kubeconfig)), node, "controller")
    agents.append(agent)
    agent.start()
    agent.wait_ready()
    agent.wire(target.key, target.ips)

    def allowed() -> set[str]:
        installed = agent.policy_of(target.key)
        assert installed is not None and installed.ingress is not None
        return {peer.cidr for rule in installed.ingress for peer in rule.peers}

    eventually(lambda: allowed() == {"10.9.3.1/32", "10.9.3.2/32"}, "the peers allowed")
    set_id = address_set_id(AddressSetKey(PodGroup(namespace, None, select(app="peer"))))
    real = published(api)[(ADDRESS_SET, address_set_name(set_id, 0))]
    forged = {
        "apiVersion": real["apiVersion"],
        "kind": ADDRESS_SET,
        "metadata": {"name": f"{set_id}-forged", "labels": real["metadata"]["labels"]},
        "spec": {
            **real["spec"],
            "pods": [*real["spec"]["pods"], {"pod": f"{namespace}/intruder", "ips": ["10.9.9.9"]}],
        },
    }
    api.create(collection_path(ADDRESS_SET), forged)
    eventually(
        lambda: (ADDRESS_SET, forged["metadata"]["name"]) not in published(api),
        "the controller deletes the forgery",
    )
    agent.enforcer.enforce_now(list(agent.enforcer.endpoints))
    assert allowed() == {"10.9.3.1/32", "10.9.3.2/32"}
    for install in agent.datapath.installs:
        peers_installed = {p.cidr for r in install.policy.ingress or () for p in r.peers}
        assert "10.9.9.9/32" not in peers_installed, "the forged shard was installed"

    # Without the controller, its PolicyTargets rewritten with an entry that names no
    # uid: a new pod of that name is not the one the entry was written for.
    for process in controllers:
        process.stop()
    newcomer = Pod(namespace, "newcomer", labels_of({"app": "t"}), ("10.9.4.2",), node)
    create_world(api, pods=[newcomer])
    name = policy_targets_name(node, 0)
    targets = published(api)[(POLICY_TARGETS, name)]
    targets["spec"]["pods"].append(
        {"pod": f"{namespace}/newcomer", "uid": "", "policies": ["allow"]}
    )
    write(api, targets)
    with pytest.raises(NotReady, match=r"has not published pod .*/newcomer"):
        agent.wire(newcomer.key, newcomer.ips, wait=3)
