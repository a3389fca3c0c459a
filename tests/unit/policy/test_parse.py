"""Parsing Kubernetes objects into the model, and refusing what the API server refuses."""

from __future__ import annotations

import pytest
import yaml

from cni.policy.errors import PolicyInputError
from cni.policy.model import (
    ContainerPort,
    IPBlock,
    LabelSelector,
    Peer,
    PolicyPort,
    Requirement,
    labels_of,
)
from cni.policy.parse import parse_namespace, parse_object, parse_pod, parse_service
from cni.policy.parse_policy import parse_network_policy


def policy_with(spec: str) -> dict:
    return yaml.safe_load(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n"
        "metadata: {name: deny, namespace: x}\nspec:\n" + spec
    )


def refused(spec: str) -> str:
    with pytest.raises(PolicyInputError) as caught:
        parse_network_policy(policy_with(spec))
    return str(caught.value)


def test_network_policy_fields() -> None:
    parsed = parse_network_policy(
        policy_with(
            """
  podSelector:
    matchLabels: {app: web}
    matchExpressions:
      - {key: tier, operator: In, values: [front, back]}
      - {key: legacy, operator: DoesNotExist}
  policyTypes: [Egress, Ingress]
  ingress:
    - from:
        - podSelector: {}
        - namespaceSelector: {matchLabels: {team: a}}
          podSelector: {matchLabels: {app: db}}
        - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}
      ports:
        - {port: 80}
        - {protocol: UDP, port: dns}
        - {protocol: SCTP, port: 9000, endPort: 9100}
        - {protocol: TCP}
  egress: [{}]
"""
        )
    )
    assert parsed.key == ("x", "deny")
    assert parsed.pod_selector == LabelSelector(
        labels_of({"app": "web"}),
        (
            Requirement("legacy", "DoesNotExist"),
            Requirement("tier", "In", frozenset({"front", "back"})),
        ),
    )
    assert parsed.policy_types == ("Ingress", "Egress")
    rule = parsed.ingress[0]
    assert rule.peers == (
        Peer(pod_selector=LabelSelector()),
        Peer(
            pod_selector=LabelSelector(labels_of({"app": "db"})),
            namespace_selector=LabelSelector(labels_of({"team": "a"})),
        ),
        Peer(ip_block=IPBlock("10.0.0.0/8", ("10.1.0.0/16",))),
    )
    assert rule.ports == (
        PolicyPort("TCP", 80),
        PolicyPort("UDP", "dns"),
        PolicyPort("SCTP", 9000, 9100),
        PolicyPort("TCP", None),
    )
    assert parsed.egress[0].peers == () and parsed.egress[0].ports == ()


def test_missing_and_empty_peer_selectors_differ() -> None:
    parsed = parse_network_policy(
        policy_with("  podSelector: {}\n  ingress: [{from: [{namespaceSelector: {}}]}]")
    )
    peer = parsed.ingress[0].peers[0]
    assert peer.pod_selector is None
    assert peer.namespace_selector == LabelSelector()


def test_policy_types_default_follows_kubernetes() -> None:
    ingress_only = parse_network_policy(policy_with("  podSelector: {}"))
    assert ingress_only.policy_types == ()
    assert ingress_only.isolates("ingress") and not ingress_only.isolates("egress")
    with_egress = parse_network_policy(policy_with("  podSelector: {}\n  egress: [{}]"))
    assert with_egress.isolates("ingress") and with_egress.isolates("egress")
    egress_only = parse_network_policy(policy_with("  podSelector: {}\n  policyTypes: [Egress]"))
    assert not egress_only.isolates("ingress") and egress_only.isolates("egress")


def test_equal_selectors_are_equal_keys_whatever_the_order() -> None:
    one = parse_network_policy(
        policy_with(
            "  podSelector: {matchExpressions: [{key: a, operator: Exists}, "
            "{key: b, operator: In, values: [y, x]}]}"
        )
    )
    two = parse_network_policy(
        policy_with(
            "  podSelector: {matchExpressions: [{key: b, operator: In, values: [x, y]}, "
            "{key: a, operator: Exists}]}"
        )
    )
    assert one.pod_selector == two.pod_selector
    assert hash(one.pod_selector) == hash(two.pod_selector)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "  podSelector: {}\n  ingress: [{ports: [{port: 80}, {port: 80, endPort: 70}]}]",
            "NetworkPolicy x/deny: spec.ingress[0].ports[1].endPort 70 is lower than port 80",
        ),
        (
            "  podSelector: {}\n  egress: [{ports: [{port: http, endPort: 90}]}]",
            "NetworkPolicy x/deny: spec.egress[0].ports[0].endPort 90 needs a numeric port",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{endPort: 90}]}]",
            "NetworkPolicy x/deny: spec.ingress[0].ports[0].endPort 90 needs a numeric port",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{protocol: ICMP}]}]",
            'NetworkPolicy x/deny: spec.ingress[0].ports[0].protocol "ICMP" '
            "is not one of TCP, UDP, SCTP",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{port: 70000}]}]",
            "NetworkPolicy x/deny: spec.ingress[0].ports[0].port 70000 is not between 1 and 65535",
        ),
        (
            "  podSelector: {matchExpressions: [{key: a, operator: Equals, values: [b]}]}",
            'NetworkPolicy x/deny: spec.podSelector.matchExpressions[0].operator "Equals" '
            "is not one of In, NotIn, Exists, DoesNotExist",
        ),
        (
            "  podSelector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}",
            'NetworkPolicy x/deny: spec.podSelector.matchExpressions[0].values ["b"] '
            "must be empty when operator is Exists",
        ),
        (
            "  podSelector: {matchExpressions: [{key: a, operator: NotIn, values: []}]}",
            "NetworkPolicy x/deny: spec.podSelector.matchExpressions[0].values [] "
            "must not be empty when operator is NotIn",
        ),
        (
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]",
            'NetworkPolicy x/deny: spec.ingress[0].from[0].ipBlock.cidr "10.0.0.0/33" '
            "is not a valid CIDR",
        ),
        (
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.1}}]}]",
            'NetworkPolicy x/deny: spec.ingress[0].from[0].ipBlock.cidr "10.0.0.1" '
            "is not a valid CIDR",
        ),
        (
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: "
            "{cidr: 10.1.0.0/16, except: [10.2.0.0/24]}}]}]",
            'NetworkPolicy x/deny: spec.ingress[0].from[0].ipBlock.except[0] "10.2.0.0/24" '
            "is not inside cidr 10.1.0.0/16 (it must be a strict subset)",
        ),
        (
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: "
            "{cidr: 10.1.0.0/16, except: [10.1.0.0/16]}}]}]",
            'NetworkPolicy x/deny: spec.ingress[0].from[0].ipBlock.except[0] "10.1.0.0/16" '
            "is not inside cidr 10.1.0.0/16 (it must be a strict subset)",
        ),
        (
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: {except: [10.1.0.0/16]}}]}]",
            "NetworkPolicy x/deny: spec.ingress[0].from[0].ipBlock.cidr is required",
        ),
        (
            "  podSelector: {}\n  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]",
            "NetworkPolicy x/deny: spec.egress[0].to[0] "
            '{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}} '
            "may not combine ipBlock with podSelector or namespaceSelector",
        ),
        (
            "  podSelector: {}\n  egress: [{to: [{}]}]",
            "NetworkPolicy x/deny: spec.egress[0].to[0] {} "
            "must set podSelector, namespaceSelector or ipBlock",
        ),
        (
            "  podSelector: {matchLabels: {app!: web}}",
            'NetworkPolicy x/deny: spec.podSelector.matchLabels "app!" is not a valid label key',
        ),
        (
            "  podSelector: {matchLabels: {app: web server}}",
            'NetworkPolicy x/deny: spec.podSelector.matchLabels[app] "web server" '
            "is not a valid label value",
        ),
        (
            "  podSelector: {matchLabels: {enabled: yes}}",  # YAML 1.1: a boolean
            "NetworkPolicy x/deny: spec.podSelector.matchLabels[enabled] true "
            "must be a string (quote it in YAML)",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{port: Web_Port}]}]",
            'NetworkPolicy x/deny: spec.ingress[0].ports[0].port "Web_Port" '
            "is not a valid port name",
        ),
        (
            "  podSelector: {}\n  policyTypes: [ingress]",
            'NetworkPolicy x/deny: spec.policyTypes[0] "ingress" is not one of Ingress, Egress',
        ),
        (
            "  podSelector: {}\n  ingress: {from: []}",
            'NetworkPolicy x/deny: spec.ingress {"from": []} must be a list',
        ),
    ],
)
def test_validation_errors_name_object_field_and_value(spec: str, message: str) -> None:
    assert refused(spec).startswith(message)


def test_error_carries_its_parts() -> None:
    with pytest.raises(PolicyInputError) as caught:
        parse_network_policy(
            policy_with("  podSelector: {}\n  ingress: [{ports: [{port: 80, endPort: 70}]}]")
        )
    assert caught.value.obj == "NetworkPolicy x/deny"
    assert caught.value.path == "spec.ingress[0].ports[0].endPort"
    assert caught.value.value == 70


def test_object_names_and_kinds_are_checked() -> None:
    with pytest.raises(PolicyInputError, match=r"^Pod: metadata.name is required"):
        parse_pod({"metadata": {"namespace": "x"}})
    with pytest.raises(PolicyInputError, match=r'^Pod x/Web: metadata.name "Web" is not a valid'):
        parse_pod({"metadata": {"namespace": "x", "name": "Web"}})
    with pytest.raises(PolicyInputError, match=r'^object: kind "Deployment" is not one of'):
        parse_object({"kind": "Deployment", "metadata": {"name": "d"}})
    with pytest.raises(PolicyInputError, match=r'apiVersion "extensions/v1beta1"'):
        parse_object(
            {"kind": "NetworkPolicy", "apiVersion": "extensions/v1beta1", "metadata": {"name": "p"}}
        )


def test_namespace_always_gets_its_name_label() -> None:
    namespace = parse_namespace(
        {
            "metadata": {
                "name": "shop",
                "labels": {"team": "a", "kubernetes.io/metadata.name": "wrong"},
            }
        }
    )
    assert namespace.labels == labels_of({"team": "a", "kubernetes.io/metadata.name": "shop"})


def test_pod_fields_and_defaults() -> None:
    pod = parse_pod(
        yaml.safe_load(
            """
kind: Pod
metadata: {name: web-0, labels: {app: web}, annotations: {ignored: "yes"}}
spec:
  nodeName: node-2
  hostNetwork: false
  containers:
    - name: web
      ports: [{name: http, containerPort: 8080}, {containerPort: 9090, protocol: UDP}]
    - name: sidecar
      ports: [{name: metrics, containerPort: 9100, protocol: TCP}]
status:
  phase: Running
  podIP: 10.0.0.7
  podIPs: [{ip: 10.0.0.7}, {ip: "fd00::7"}]
"""
        )
    )
    assert pod.key == ("default", "web-0")
    assert pod.labels == labels_of({"app": "web"})
    assert pod.ips == ("10.0.0.7", "fd00::7")
    assert pod.node_name == "node-2"
    assert pod.ports == (
        ContainerPort("http", 8080, "TCP"),
        ContainerPort("", 9090, "UDP"),
        ContainerPort("metrics", 9100, "TCP"),
    )
    assert not pod.host_network


def test_pod_without_address_and_finished_pod() -> None:
    assert parse_pod({"metadata": {"name": "new", "namespace": "x"}}).ips == ()
    finished = parse_pod(
        {
            "metadata": {"name": "job", "namespace": "x"},
            "status": {"phase": "Succeeded", "podIP": "10.0.0.9"},
        }
    )
    assert finished.ips == ()  # its address may already belong to another pod


def test_pod_port_and_address_errors() -> None:
    with pytest.raises(PolicyInputError, match=r"spec.containers\[0\].ports\[0\].containerPort 0 "):
        parse_pod(
            {
                "metadata": {"name": "p", "namespace": "x"},
                "spec": {"containers": [{"ports": [{"containerPort": 0}]}]},
            }
        )
    with pytest.raises(PolicyInputError, match=r'status.podIPs\[0\].ip "10.0.0.300"'):
        parse_pod(
            {
                "metadata": {"name": "p", "namespace": "x"},
                "status": {"podIPs": [{"ip": "10.0.0.300"}]},
            }
        )


def test_service_cluster_ips() -> None:
    service = parse_service(
        yaml.safe_load(
            """
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00::a"]
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}, {port: 53, protocol: UDP}]
"""
        )
    )
    assert service.cluster_ips == ("10.96.0.10", "fd00::a")
    assert service.selector == labels_of({"app": "web"})
    assert [(p.port, p.target_port, p.protocol) for p in service.ports] == [
        (80, "http", "TCP"),
        (53, 53, "UDP"),
    ]
    headless = parse_service(
        {"metadata": {"name": "db", "namespace": "shop"}, "spec": {"clusterIP": "None"}}
    )
    assert headless.cluster_ips == ()
