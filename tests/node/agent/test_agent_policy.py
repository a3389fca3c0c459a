"""NetworkPolicy semantics end to end: objects applied to the agent, pods wired
through it, real packets between pod namespaces.

Namespaces x, y, z (labelled ns=<name>) with pods a, b, c each (labelled
pod=<name>, container ports serve-80-tcp, serve-81-tcp, serve-80-udp,
serve-81-udp), all serving TCP and UDP on 80 and 81, as in Kubernetes' own
NetworkPolicy e2e suite. Each test applies its policies, probes the whole
matrix by pod address, and removes them again.
"""

from __future__ import annotations

import functools
import random
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.agent import (
    SERVED,
    AgentNetwork,
    PolicyCluster,
    differences,
    expect,
    namespace,
    pod_object,
    policy,
    service,
)
from tests.harness.cni_run import (
    SESSION_TAG,
    TEST_NETNS_PREFIX,
    PodNamespaces,
    in_netns,
    sluicectl,
)
from tests.harness.kube_proxy import KubeProxy


@pytest.fixture(scope="module")
def cluster(bin_dir: Path) -> Iterator[PolicyCluster]:
    with tempfile.TemporaryDirectory(prefix="sluice-agent-") as work:
        net = AgentNetwork.create(Path(work), bin_dir)
        pods = PodNamespaces(TEST_NETNS_PREFIX)
        made = PolicyCluster(net, pods)
        try:
            net.start()
            made.create()
            yield made
        finally:
            try:
                made.destroy()
            finally:
                net.cleanup()
                pods.cleanup()


@pytest.fixture
def apply(cluster: PolicyCluster) -> Iterator[Any]:
    """Apply objects for one test; afterwards its policies go and labels are restored."""
    applied: list[dict[str, Any]] = []

    def do(*documents: dict[str, Any]) -> dict[str, Any]:
        applied.extend(documents)
        return cluster.net.apply(*documents)

    yield do
    policies = [d for d in applied if d["kind"] == "NetworkPolicy"]
    if policies:
        cluster.net.delete_objects(*policies)
    if any(d["kind"] != "NetworkPolicy" for d in applied):
        cluster.net.apply(*cluster.base_objects())


def check(
    cluster: PolicyCluster,
    allowed: Any,
    port: int = 80,
    protocol: str = "tcp",
    via: dict[str, str] | None = None,
) -> None:
    got = cluster.probe(port, protocol, via=via)
    wanted = expect(cluster, allowed)
    # A flow that should pass but timed out may only have met a busy machine: those
    # sources probe again, with more time. A flow that passed is never retried.
    missed = {cell for cell, ok in got.items() if wanted[cell] and not ok}
    if missed:
        sources = sorted({source for source, _ in missed})
        again = cluster.probe(port, protocol, sources=sources, via=via, timeout=5.0)
        got.update({cell: again[cell] for cell in missed})
    wrong = differences(got, wanted)
    where = "through ClusterIPs" if via else "by pod address"
    assert not wrong, f"{port}/{protocol} {where}:\n" + "\n".join(wrong)


def ns_of(key: str) -> str:
    return key.split("/")[0]


def name_of(key: str) -> str:
    return key.split("/")[1]


ANYONE = {}  # a peer with no selector at all: every address


# -- isolation and defaults -------------------------------------------------------------------


def test_no_policy_means_everyone_reaches_everyone(cluster: PolicyCluster) -> None:
    for port, protocol in ((80, "tcp"), (81, "udp")):
        check(cluster, lambda s, t: True, port, protocol)


def test_default_deny_ingress(cluster: PolicyCluster, apply: Any) -> None:
    apply(policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"]))
    check(cluster, lambda s, t: ns_of(t) != "x")
    check(cluster, lambda s, t: ns_of(t) != "x", 81, "udp")


def test_default_deny_egress(cluster: PolicyCluster, apply: Any) -> None:
    apply(policy("x", "deny-egress", podSelector={}, policyTypes=["Egress"]))
    check(cluster, lambda s, t: ns_of(s) != "x")


def test_deny_both_directions_with_empty_rule_lists(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "y",
            "deny-both",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress", "Egress"],
            ingress=[],
            egress=[],
        )
    )
    check(cluster, lambda s, t: "y/a" not in (s, t))


def test_allow_all_after_deny_all(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"]),
        policy("x", "allow-all", podSelector={}, ingress=[ANYONE]),
    )
    check(cluster, lambda s, t: True)


def test_policy_types_default_to_ingress_without_egress_rules(
    cluster: PolicyCluster, apply: Any
) -> None:
    # No policyTypes and only ingress rules: Ingress is isolated, egress stays open.
    apply(
        policy(
            "x",
            "from-b",
            podSelector={"matchLabels": {"pod": "a"}},
            ingress=[{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        )
    )
    check(cluster, lambda s, t: t != "x/a" or s == "x/b")


def test_policy_types_include_egress_when_egress_rules_exist(
    cluster: PolicyCluster, apply: Any
) -> None:
    apply(
        policy(
            "x",
            "to-y",
            podSelector={"matchLabels": {"pod": "a"}},
            egress=[{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}],
        )
    )
    # Ingress is isolated too (always set without policyTypes), with no ingress rules.
    check(cluster, lambda s, t: (s != "x/a" or ns_of(t) == "y") and t != "x/a")


# -- peers -----------------------------------------------------------------------------------


def test_pod_selector_peer_is_in_the_policys_namespace(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-pod-b",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        )
    )
    check(cluster, lambda s, t: t != "x/a" or s == "x/b")


def test_namespace_selector_peer(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-y",
            podSelector={},
            policyTypes=["Ingress"],
            ingress=[{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}],
        )
    )
    check(cluster, lambda s, t: ns_of(t) != "x" or ns_of(s) == "y")


def test_both_selectors_in_one_peer_are_and(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-y-b",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"ns": "y"}},
                            "podSelector": {"matchLabels": {"pod": "b"}},
                        }
                    ]
                }
            ],
        )
    )
    check(cluster, lambda s, t: t != "x/a" or s == "y/b")


def test_two_peers_are_or(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-b-or-z",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[
                {
                    "from": [
                        {"podSelector": {"matchLabels": {"pod": "b"}}},
                        {"namespaceSelector": {"matchLabels": {"ns": "z"}}},
                    ]
                }
            ],
        )
    )
    check(cluster, lambda s, t: t != "x/a" or s == "x/b" or ns_of(s) == "z")


@pytest.mark.parametrize(
    ("expression", "admitted"),
    [
        ({"key": "pod", "operator": "In", "values": ["b", "c"]}, {"b", "c"}),
        ({"key": "pod", "operator": "NotIn", "values": ["b"]}, {"a", "c"}),
        ({"key": "pod", "operator": "Exists"}, {"a", "b", "c"}),
        ({"key": "pod", "operator": "DoesNotExist"}, set()),
    ],
)
def test_match_expressions(
    cluster: PolicyCluster, apply: Any, expression: dict[str, Any], admitted: set[str]
) -> None:
    apply(
        policy(
            "x",
            "expr",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[{"from": [{"podSelector": {"matchExpressions": [expression]}}]}],
        )
    )
    check(cluster, lambda s, t: t != "x/a" or (ns_of(s) == "x" and name_of(s) in admitted))


def test_namespace_match_expressions(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "not-from-y",
            podSelector={},
            policyTypes=["Ingress"],
            ingress=[
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchExpressions": [
                                    {"key": "ns", "operator": "NotIn", "values": ["y"]}
                                ]
                            }
                        }
                    ]
                }
            ],
        )
    )
    check(cluster, lambda s, t: ns_of(t) != "x" or ns_of(s) != "y")


def test_ip_block_with_except(cluster: PolicyCluster, apply: Any) -> None:
    subnet = cluster.net.network.subnet
    excluded = cluster.pods["y/b"].ip
    apply(
        policy(
            "x",
            "cidr",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[{"from": [{"ipBlock": {"cidr": subnet, "except": [f"{excluded}/32"]}}]}],
        )
    )
    check(cluster, lambda s, t: t != "x/a" or s != "y/b")


def test_egress_to_an_ip_block(cluster: PolicyCluster, apply: Any) -> None:
    target = cluster.pods["z/c"].ip
    apply(
        policy(
            "x",
            "egress-cidr",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Egress"],
            egress=[{"to": [{"ipBlock": {"cidr": f"{target}/32"}}]}],
        )
    )
    check(cluster, lambda s, t: s != "x/a" or t == "z/c")


# -- ports ----------------------------------------------------------------------------------


def only_from_y_on(ports: list[dict[str, Any]]) -> dict[str, Any]:
    return policy(
        "x",
        "ports",
        podSelector={"matchLabels": {"pod": "a"}},
        policyTypes=["Ingress"],
        ingress=[{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": ports}],
    )


def from_y(s: str, t: str) -> bool:
    return t != "x/a" or ns_of(s) == "y"


def closed(s: str, t: str) -> bool:
    return t != "x/a"


def test_numbered_port(cluster: PolicyCluster, apply: Any) -> None:
    apply(only_from_y_on([{"port": 80}]))
    check(cluster, from_y, 80, "tcp")
    check(cluster, closed, 81, "tcp")
    check(cluster, closed, 80, "udp")


def test_named_port_ingress(cluster: PolicyCluster, apply: Any) -> None:
    apply(only_from_y_on([{"port": "serve-81-tcp", "protocol": "TCP"}]))
    check(cluster, closed, 80, "tcp")
    check(cluster, from_y, 81, "tcp")


def test_end_port_range(cluster: PolicyCluster, apply: Any) -> None:
    apply(only_from_y_on([{"port": 80, "endPort": 81, "protocol": "TCP"}]))
    check(cluster, from_y, 80, "tcp")
    check(cluster, from_y, 81, "tcp")
    check(cluster, closed, 81, "udp")


def test_udp_port(cluster: PolicyCluster, apply: Any) -> None:
    apply(only_from_y_on([{"port": 81, "protocol": "UDP"}]))
    check(cluster, closed, 81, "tcp")
    check(cluster, from_y, 81, "udp")


def test_several_ports_and_protocols(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        only_from_y_on(
            [{"port": 80, "protocol": "TCP"}, {"port": "serve-80-udp", "protocol": "UDP"}]
        )
    )
    check(cluster, from_y, 80, "tcp")
    check(cluster, from_y, 80, "udp")
    check(cluster, closed, 81, "udp")


def test_named_port_egress_resolves_on_the_peer(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "egress-named",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Egress"],
            egress=[
                {
                    "to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}],
                    "ports": [{"port": "serve-81-tcp"}],
                }
            ],
        )
    )
    check(cluster, lambda s, t: s != "x/a", 80, "tcp")
    check(cluster, lambda s, t: s != "x/a" or ns_of(t) == "z", 81, "tcp")


# -- combinations and changes ---------------------------------------------------------------------


def test_policies_selecting_a_pod_add_up(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-b",
            podSelector={"matchLabels": {"pod": "a"}},
            ingress=[{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        ),
        policy(
            "x",
            "from-z",
            podSelector={"matchLabels": {"pod": "a"}},
            ingress=[{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}]}],
        ),
    )
    check(cluster, lambda s, t: t != "x/a" or s == "x/b" or ns_of(s) == "z")


def test_egress_policy_lets_replies_in(cluster: PolicyCluster, apply: Any) -> None:
    # x/a may send only to y, and receive from nobody: its connections to y still
    # get their replies, and others' connections to it get nothing back.
    apply(
        policy(
            "x",
            "lockdown",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress", "Egress"],
            egress=[{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}],
        )
    )
    check(cluster, lambda s, t: (s != "x/a" or ns_of(t) == "y") and t != "x/a")


def test_update_in_place(cluster: PolicyCluster, apply: Any) -> None:
    def from_pod(name: str) -> dict[str, Any]:
        return policy(
            "x",
            "moving",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[{"from": [{"podSelector": {"matchLabels": {"pod": name}}}]}],
        )

    apply(from_pod("b"))
    check(cluster, lambda s, t: t != "x/a" or s == "x/b")
    apply(from_pod("c"))
    check(cluster, lambda s, t: t != "x/a" or s == "x/c")


def test_deleting_a_policy_opens_up_again(cluster: PolicyCluster) -> None:
    deny = policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"])
    cluster.net.apply(deny)
    check(cluster, lambda s, t: ns_of(t) != "x")
    cluster.net.delete_objects(deny)
    check(cluster, lambda s, t: True)


def test_pod_label_change_moves_it_in_and_out(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-friends",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[
                {
                    "from": [
                        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"friend": "yes"}}}
                    ]
                }
            ],
        )
    )
    check(cluster, lambda s, t: t != "x/a")
    apply(pod_object("z", "b", pod="b", friend="yes"))
    check(cluster, lambda s, t: t != "x/a" or s == "z/b")


def test_namespace_label_change(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-trusted",
            podSelector={},
            policyTypes=["Ingress"],
            ingress=[{"from": [{"namespaceSelector": {"matchLabels": {"trusted": "yes"}}}]}],
        )
    )
    check(cluster, lambda s, t: ns_of(t) != "x")
    apply(namespace("z", ns="z", trusted="yes"))
    check(cluster, lambda s, t: ns_of(t) != "x" or ns_of(s) == "z")


def test_the_node_reaches_pods_under_default_deny(cluster: PolicyCluster, apply: Any) -> None:
    apply(policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"]))
    target = cluster.pods["x/a"].ip
    probe = str(Path(__file__).parents[2] / "harness" / "matrix_probe.py")
    proc = subprocess.run(
        ["/usr/bin/python3", probe, f'[["{target}", 80, "tcp"], ["{target}", 81, "udp"]]'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "[true, true]"


def test_tightening_cuts_established_flows(cluster: PolicyCluster, apply: Any) -> None:
    a, b = cluster.pods["x/a"], cluster.pods["y/b"]
    script = (
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], 80), timeout=1.5)\n"
        "s.sendall(b'1'); assert s.recv(1) == b'1'\n"
        "print('established', flush=True); sys.stdin.readline()\n"
        "s.sendall(b'2')\n"
        "try:\n    print('echo' if s.recv(1) == b'2' else 'closed')\n"
        "except OSError:\n    print('cut')\n"
    )
    held = subprocess.Popen(
        ["ip", "netns", "exec", Path(b.netns).name, "/usr/bin/python3", "-c", script, a.ip],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert held.stdout is not None and held.stdout.readline().strip() == "established"
    apply(policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"]))
    out, _ = held.communicate("go\n", timeout=20)
    assert out.strip() == "cut"


# -- what the operator sees -----------------------------------------------------------------------


def test_get_and_explain(cluster: PolicyCluster, apply: Any) -> None:
    apply(
        policy(
            "x",
            "from-b",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[
                {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": 80}]}
            ],
        )
    )
    conf = str(cluster.net.conflist)
    endpoints = sluicectl("get", "endpoints", "--conf", conf)
    assert endpoints.returncode == 0, endpoints.stderr
    line = next(row for row in endpoints.stdout.splitlines() if row.startswith("x/a "))
    assert "isolated" in line and "x/from-b" in line
    policies = sluicectl("get", "policies", "--conf", conf, "-o", "json")
    assert '"x/from-b"' in policies.stdout
    text = sluicectl("explain", "x/a", "--conf", conf).stdout
    assert "x/from-b" in text and "x/b" in text
    c_ip, b_ip = cluster.pods["x/c"].ip, cluster.pods["x/b"].ip
    denied = sluicectl("explain", "x/a", "--from", f"{c_ip}:80/tcp", "--conf", conf)
    assert denied.stdout.startswith("DENY") and "no rule allows it" in denied.stdout
    allowed = sluicectl("explain", "x/a", "--from", f"{b_ip}:80/tcp", "--conf", conf)
    assert allowed.stdout.startswith("ALLOW") and "x/from-b ingress rule 0" in allowed.stdout
    unknown = sluicectl("explain", "x/nope", "--conf", conf)
    assert unknown.returncode != 0 and "knows no pod x/nope" in unknown.stderr


def test_apply_refuses_an_invalid_manifest_whole(cluster: PolicyCluster, apply: Any) -> None:
    good = policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"])
    bad = policy("x", "bad", podSelector={}, ingress=[{"ports": [{"port": 80, "endPort": 70}]}])
    answer = cluster.net.ask({"op": "apply", "manifest": _yaml(good, bad)})
    assert "endPort 70 is lower than port 80" in answer["error"]
    check(cluster, lambda s, t: True)  # nothing of it was applied


def _yaml(*documents: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump_all(documents)


def test_probes_ran_in_pod_namespaces(cluster: PolicyCluster) -> None:
    """Sanity: each pod has its own address, seen from inside its namespace."""
    pod = cluster.pods["y/c"]
    out = in_netns(pod.netns, "ip", "-4", "-o", "addr", "show", "eth0").stdout
    assert pod.ip in out


# -- the same through Services (kube-proxy's DNAT on the path, as in the e2e suite) ----------


class ClusterIPs(dict[str, str]):
    """Pod -> the ClusterIP of its Service (kube-proxy's iptables shape, TCP 80 to the
    pod's port 80), which the agent knows (it tells the datapath its ClusterIPs)."""

    def __init__(self, cluster: PolicyCluster, proxy: KubeProxy, prefix: str) -> None:
        super().__init__()
        self.cluster, self.proxy, self.prefix = cluster, proxy, prefix
        self.documents: list[dict[str, Any]] = []

    def add(self, *keys: str) -> None:
        documents = []
        for key in keys:
            pod = self.cluster.pods[key]
            self[key] = address = f"{self.prefix}.{10 + len(self.proxy.services)}"
            self.proxy.service(f"S{len(self.proxy.services)}", address, [(pod.ip, 80)])
            documents.append(service(pod.namespace, f"svc-{pod.name}", address, pod=pod.name))
        self.cluster.net.apply(*documents)
        self.documents += documents


@pytest.fixture(scope="module")
def cluster_ips(cluster: PolicyCluster) -> Iterator[ClusterIPs]:
    prefix = f"10.{random.randint(96, 99)}.{random.randint(0, 255)}"
    proxy = KubeProxy(f"{SESSION_TAG}{random.randint(0, 0xFFF):03x}".upper())
    addresses = ClusterIPs(cluster, proxy, prefix)
    try:
        proxy.setup()
        addresses.add(*sorted(cluster.pods))
        yield addresses
    finally:
        if addresses.documents:
            cluster.net.delete_objects(*addresses.documents)
        proxy.cleanup()


def test_through_cluster_ips_without_policy(
    cluster: PolicyCluster, cluster_ips: dict[str, str]
) -> None:
    check(cluster, lambda s, t: True, via=cluster_ips)


def test_through_cluster_ips_default_deny_ingress(
    cluster: PolicyCluster, cluster_ips: dict[str, str], apply: Any
) -> None:
    apply(policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"]))
    check(cluster, lambda s, t: ns_of(t) != "x", via=cluster_ips)


def test_through_cluster_ips_egress_is_judged_on_the_backend(
    cluster: PolicyCluster, cluster_ips: dict[str, str], apply: Any
) -> None:
    apply(
        policy(
            "x",
            "to-y",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Egress"],
            egress=[{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}],
        )
    )
    check(cluster, lambda s, t: s != "x/a" or ns_of(t) == "y", via=cluster_ips)


def test_through_cluster_ips_egress_port_is_the_target_port(
    cluster: PolicyCluster, cluster_ips: dict[str, str], apply: Any
) -> None:
    # The Services listen on 80 and forward to the pods' port 80: a rule for the
    # pods' port 81 does not open them, one for serve-80-tcp does.
    def to_z_on(port: object) -> dict[str, Any]:
        return policy(
            "x",
            "to-z",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Egress"],
            egress=[
                {
                    "to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}],
                    "ports": [{"port": port}],
                }
            ],
        )

    apply(to_z_on(81))
    check(cluster, lambda s, t: s != "x/a", via=cluster_ips)
    apply(to_z_on("serve-80-tcp"))
    check(cluster, lambda s, t: s != "x/a" or ns_of(t) == "z", via=cluster_ips)


def test_through_cluster_ips_both_selectors(
    cluster: PolicyCluster, cluster_ips: dict[str, str], apply: Any
) -> None:
    apply(
        policy(
            "x",
            "from-y-b",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"ns": "y"}},
                            "podSelector": {"matchLabels": {"pod": "b"}},
                        }
                    ]
                }
            ],
        )
    )
    check(cluster, lambda s, t: t != "x/a" or s == "y/b", via=cluster_ips)


# -- egress towards destinations that appear after the policy ---------------------------------
# x/a may send only TCP 80 to pods a and b of namespaces y and z (and DNS). A pod, a
# namespace's pods, and a pod relabelled out of the peers and back, all after the
# policy: by address on every served port, and through ClusterIPs (TCP 80).

TO_A_AND_B_IN_Y_AND_Z = policy(
    "x",
    "egress-80",
    podSelector={"matchLabels": {"pod": "a"}},
    policyTypes=["Egress"],
    egress=[
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]
                    },
                    "podSelector": {
                        "matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]
                    },
                }
            ],
            "ports": [{"port": 80, "protocol": "TCP"}],
        },
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
    ],
)


def egress_80(peers: set[str]) -> Any:
    def allowed(s: str, t: str, port: int, protocol: str) -> bool:
        return s != "x/a" or (t in peers and (port, protocol) == (80, "tcp"))

    return allowed


def check_served(cluster: PolicyCluster, allowed: Any, cluster_ips: ClusterIPs) -> None:
    for port, protocol in SERVED:
        check(cluster, functools.partial(allowed, port=port, protocol=protocol), port, protocol)
    check(cluster, lambda s, t: allowed(s, t, 80, "tcp"), via=cluster_ips)


PEERS = {"y/a", "y/b", "z/a", "z/b"}


def test_egress_holds_towards_a_pod_that_appears_later(
    cluster: PolicyCluster, cluster_ips: ClusterIPs, apply: Any
) -> None:
    apply(TO_A_AND_B_IN_Y_AND_Z)
    cluster.add_pod("x", "d")
    try:
        cluster_ips.add("x/d")
        check_served(cluster, egress_80(PEERS), cluster_ips)
    finally:
        cluster.remove_pod("x/d")
        cluster_ips.pop("x/d")


def test_egress_holds_towards_a_namespace_that_appears_later(
    cluster: PolicyCluster, cluster_ips: ClusterIPs, apply: Any
) -> None:
    apply(TO_A_AND_B_IN_Y_AND_Z)
    cluster.add_pod("w", "a")
    cluster.add_pod("w", "b")
    try:
        cluster_ips.add("w/a", "w/b")
        check_served(cluster, egress_80(PEERS), cluster_ips)
    finally:
        for key in ("w/a", "w/b"):
            cluster.remove_pod(key)
            cluster_ips.pop(key)
        cluster.net.delete_objects(namespace("w"))


def test_egress_holds_while_a_peer_is_relabelled_out_and_back(
    cluster: PolicyCluster, cluster_ips: ClusterIPs, apply: Any
) -> None:
    apply(TO_A_AND_B_IN_Y_AND_Z)
    check_served(cluster, egress_80(PEERS), cluster_ips)
    apply(pod_object("y", "b", pod="e"))
    check_served(cluster, egress_80(PEERS - {"y/b"}), cluster_ips)
    apply(pod_object("y", "b", pod="b"))
    check_served(cluster, egress_80(PEERS), cluster_ips)
