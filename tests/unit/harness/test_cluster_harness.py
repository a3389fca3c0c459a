"""The Kubernetes harness's pure parts: go.mod, ports, state, e2e tally."""

from __future__ import annotations

from pathlib import Path

from tests.harness import build, e2e
from tests.harness.cache import K8S_VERSION, STAGING_VERSION, K8sCache
from tests.harness.cluster_state import ClusterState
from tests.harness.components import Ports
from tests.harness.host import HostSnapshot
from tests.harness.processes import ProcessRecord

UPSTREAM_GO_MOD = """\
module k8s.io/kubernetes

go 1.24.0

godebug default=go1.24

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
)
"""


def test_scratch_go_mod_pins_every_staging_module() -> None:
    go_mod = build.scratch_go_mod(UPSTREAM_GO_MOD)
    assert f"require k8s.io/kubernetes {K8S_VERSION}" in go_mod
    assert f"\tk8s.io/api => k8s.io/api {STAGING_VERSION}" in go_mod
    assert f"\tk8s.io/client-go => k8s.io/client-go {STAGING_VERSION}" in go_mod
    assert "go 1.24.0" in go_mod
    assert "godebug default=go1.24" in go_mod
    assert STAGING_VERSION == "v0.34.4"


def test_tools_go_is_behind_the_tools_tag() -> None:
    tools = build.tools_go()
    assert tools.startswith("//go:build tools\n")
    assert '_ "k8s.io/kubernetes/cmd/kubelet"' in tools
    assert '_ "k8s.io/kubernetes/test/e2e"' in tools


def test_ports_are_distinct_and_outside_nodeport_and_ephemeral_ranges() -> None:
    listeners = Ports().listeners("192.0.2.2")
    ports = [port for _, port in listeners.values()]
    assert len(set(ports)) == len(ports)
    assert all(1024 < p < 30000 for p in ports), ports
    assert Ports().apiserver == 24443


def test_cache_counts_a_file_only_with_its_stamp(tmp_path: Path) -> None:
    cache = K8sCache(tmp_path)
    kubelet = cache.binary("kubelet")
    kubelet.parent.mkdir(parents=True)
    kubelet.write_bytes(b"\x7fELF")
    assert not cache.is_current(kubelet, "recipe-1")
    cache.mark_built(kubelet, "recipe-1")
    assert cache.is_current(kubelet, "recipe-1")
    assert not cache.is_current(kubelet, "recipe-2")
    assert kubelet not in cache.missing()


def test_cluster_state_round_trips_and_ignores_unknown_keys() -> None:
    state = ClusterState(
        name="t",
        directory="/var/lib/sluice-k8s/t",
        node_name="vm",
        node_ip="192.0.2.2",
        port_base=24000,
        pod_cidr="10.244.0.0/24",
        network="k8s-t",
        bpf_dir="/sys/fs/bpf/sluice-k8s-t",
        cgroup_root="/sluice-k8s-t",
        containerd_base="/var/lib/sluice-k8s/t/sluice-ctrd-t",
        host=HostSnapshot([["ip", "filter"]], ["/var/lib/kubelet"], {"kernel/panic": "1"}),
        processes={"etcd": ProcessRecord("etcd", 10, 20, ["etcd"], "/x/etcd.log")},
    )
    data = state.to_json()
    data["from_a_newer_version"] = True
    assert ClusterState.from_json(data) == state


JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="Kubernetes e2e suite" tests="4">
  <testcase name="[It] [sig-network] Netpol NetworkPolicy should support allow-all policy">
  </testcase>
  <testcase name="[It] [sig-network] Netpol NetworkPolicy should deny ingress">
    <failure message="Had 7 wrong results">...</failure>
  </testcase>
  <testcase name="[It] [sig-network] Netpol [Feature:SCTPConnectivity] NetworkPolicy with SCTP">
    <skipped message="skipped"/>
  </testcase>
  <testcase name="[It] [sig-storage] something else"><skipped message="skipped"/></testcase>
</testsuite></testsuites>
"""


def test_tally_counts_only_the_selected_specs(tmp_path: Path) -> None:
    (tmp_path / "junit_01.xml").write_text(JUNIT)
    tally = e2e.tally_junit(tmp_path, e2e.NETPOL_FOCUS, e2e.NETPOL_SKIP)
    assert len(tally.passed) == 1 and "allow-all" in tally.passed[0]
    assert len(tally.failed) == 1 and "deny ingress" in tally.failed[0]
    assert tally.skipped == []
    assert tally.total == 2
