"""conf/kind-config.yaml and the cluster configurations `make kind` derives from it."""

from __future__ import annotations

import ipaddress

import pytest
import yaml

from tests.harness import kind


def test_the_config_disables_kinds_cni_and_sets_the_pod_subnet() -> None:
    config = yaml.safe_load(kind.KIND_CONFIG.read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    networking = config["networking"]
    assert networking["disableDefaultCNI"] is True
    assert ipaddress.ip_network(networking["podSubnet"]) == ipaddress.ip_network("10.244.0.0/16")
    assert networking["kubeProxyMode"] in ("iptables", "nftables")
    pods = ipaddress.ip_network(networking["podSubnet"])
    assert not pods.overlaps(ipaddress.ip_network(networking["serviceSubnet"]))


def test_every_node_mounts_the_hosts_kernel_headers() -> None:
    # kind mounts /lib/modules; its build/source links point into /usr/src.
    for node in yaml.safe_load(kind.KIND_CONFIG.read_text())["nodes"]:
        mounts = {m["containerPath"]: m for m in node["extraMounts"]}
        assert mounts["/usr/src"]["hostPath"] == "/usr/src"
        assert mounts["/usr/src"]["readOnly"] is True


@pytest.mark.parametrize("nodes", [1, 2, 3, 5])
def test_make_kind_writes_one_control_plane_and_the_rest_workers(nodes: int) -> None:
    config = kind.cluster_config(nodes)
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane"] + ["worker"] * (nodes - 1)
    assert config["networking"]["disableDefaultCNI"] is True
    # The generated file is plain YAML that kind reads (no anchors left to resolve).
    again = yaml.safe_load(yaml.safe_dump(config))
    assert again == config


def test_a_cluster_without_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        kind.cluster_config(0)
