"""sluice deployed as a user deploys it: the image loaded into a one-node kind cluster's
containerd and conf/ applied (tests/harness/daemonset.py); nothing of sluice is on the
host. The node turns Ready only once the init container wrote the conflist, CoreDNS
runs on sluice's network, the Netpol e2e subset passes, and a rolling update of the
DaemonSet to another image tag (and back) under live traffic keeps the established
allowed flow, every pod's address and every denial, and a pod created meanwhile starts.

Part of ``make test``: the first run on a machine also builds the kind node image and
the sluice image (about 10 minutes from cold, cached after).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import daemonset, dockerd, kind
from tests.harness.daemonset import DeployedCluster
from tests.harness.e2e import NETPOL_SKIP, run_e2e
from tests.harness.waiting import eventually

pytestmark = [pytest.mark.docker, pytest.mark.slow]

NEXT_TAG = "upgrade-next"
AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.56"
E2E_SUBSET = (
    "should support allow-all policy",
    "should support a 'default-deny-ingress' policy",
    "should allow ingress access on one named port",
    "should enforce policy to allow traffic only from a different namespace, based on "
    "NamespaceSelector",
)


# A cluster of that name (python -m tests.harness.daemonset up --name NAME) is used and
# kept, for running one test again; the first test then sees its nodes Ready before.
REUSE_ENV = "SLUICE_DS_CLUSTER"


@pytest.fixture(scope="module")
def deployed() -> Iterator[tuple[DeployedCluster, dict[str, Any]]]:
    reused = os.environ.get(REUSE_ENV)
    name = reused or f"sluice-ds-{uuid.uuid4().hex[:4]}"
    try:
        yield daemonset.up(name, nodes=1)
    finally:
        if not reused:
            left = daemonset.down(name)
            assert all("failed" not in line for line in left), left


def test_the_node_turns_ready_once_the_init_container_wrote_the_conflist(
    deployed: tuple[DeployedCluster, dict[str, Any]],
) -> None:
    cluster, seen = deployed
    assert not any(seen["ready before"].values()), seen["ready before"]
    assert seen["conflist before"] == [None]
    assert all(seen["ready after"].values()), seen["ready after"]
    (conflist,) = (json.loads(text) for text in seen["conflists"])
    assert conflist["plugins"][0]["type"] == "sluice"
    assert conflist["plugins"][0]["policy"] == "enforce"
    (cidr,) = seen["pod cidrs"].values()
    assert conflist["plugins"][0]["ipam"]["subnet"] == cidr
    # CoreDNS runs on sluice's network: its addresses are from the node's podCIDR.
    assert seen["coredns"] and all(
        ipaddress.ip_address(ip) in ipaddress.ip_network(cidr) for ip in seen["coredns"]
    ), seen
    # The image is named by its digest, and the agent runs that content.
    assert cluster.agent_image() == seen["image"], (cluster.agent_image(), seen["image"])
    digest = seen["image"].split("@", 1)[1]
    (agent,) = cluster.agent_pods()
    assert all(s["imageID"].endswith(digest) for s in agent["status"]["containerStatuses"])


# CapEff of a process with exactly CAP_NET_ADMIN (12) and CAP_SYS_ADMIN (21).
AGENT_CAPABILITIES = (1 << 12) | (1 << 21)


def test_the_agent_runs_unprivileged_with_two_capabilities(
    deployed: tuple[DeployedCluster, dict[str, Any]],
) -> None:
    """What the kernel says of the running agent (not only what the manifest asks):
    its effective capabilities, a read-only /proc/sys and /sys, no node device, and
    yet a datapath loaded and pods wired (the subset and the update below)."""
    cluster, _ = deployed
    (agent,) = cluster.agent_pods()
    name = agent["metadata"]["name"]

    def run(script: str) -> str:
        return cluster.kubectl(
            "exec", "-n", "kube-system", name, "-c", "agent", "--", "/bin/sh", "-c", script
        )

    status = run("cat /proc/1/status")
    (cap_eff,) = [line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")]
    assert int(cap_eff, 16) == AGENT_CAPABILITIES, status
    refused = run(
        "for f in /proc/sys/net/ipv4/ip_forward /sys/kernel/mm/ksm/run; do"
        " (echo 1 > $f) 2>/dev/null && echo WROTE $f || echo refused $f; done;"
        " test -e /dev/kmsg && echo HAS /dev/kmsg || echo no /dev/kmsg"
    )
    assert "WROTE" not in refused and "HAS" not in refused, refused
    assert refused.count("refused") == 2, refused
    # What it cannot write itself, it writes through the node's /proc/sys/net.
    assert run("cat /host/proc/sys/net/ipv4/ip_forward").strip() == "1"
    shown = json.loads(
        run("sluicectl datapath show -o json --conf /host/etc/cni/net.d/10-sluice.conflist")
    )
    assert shown["programs"] and shown["afterNat"] and shown["endpoints"], shown


def test_the_netpol_e2e_subset_passes(deployed: tuple[DeployedCluster, dict[str, Any]]) -> None:
    cluster, _ = deployed
    focus = (
        r"\[sig-network\] Netpol NetworkPolicy between server and client ("
        + "|".join(re.escape(spec) for spec in E2E_SUBSET)
        + ")"
    )
    # kind runs the ServiceAccount controller: the suite waits for each namespace's
    # "default" account (the last flag wins), which a loaded machine creates late.
    tally = run_e2e(
        cluster,  # type: ignore[arg-type]
        focus=focus,
        skip=rf"{NETPOL_SKIP}|using UDP|using SCTP",
        extra_args=["--e2e-verify-service-account=true"],
    )
    assert not tally.failed and len(tally.passed) == len(E2E_SUBSET), tally.summary()


# -- the rolling update -------------------------------------------------------------------


def pod(name: str, namespace: str, labels: dict[str, str], script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": AGNHOST,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                }
            ],
        },
    }


SERVER = "exec /agnhost netexec --http-port 8080"
# One TCP connection for the whole test: an HTTP/1.1 request every 0.2 s on it. Should
# the connection be cut, nc exits and the count stops growing.
FLOW = (
    "(while true; do printf 'GET /echo?msg=alive HTTP/1.1\\r\\nHost: s\\r\\n\\r\\n';"
    " sleep 0.2; done) | nc {server} 8080 > /tmp/flow; echo CUT >> /tmp/flow; sleep 3600"
)
# A new connection every 0.2 s to each target (agnhost connect, as the Netpol e2e
# probes do; busybox's nc has no -z); a line per one that connected.
PROBE = (
    "while true; do /agnhost connect {allowed}:8080 --timeout=1s && echo allowed;"
    " /agnhost connect {denied}:8080 --timeout=1s && echo DENIED-PASSED; sleep 0.2;"
    " done > /tmp/probe 2>/dev/null"
)


def apply(cluster: DeployedCluster, *objects: dict[str, Any]) -> None:
    text = "\n---\n".join(json.dumps(o) for o in objects)
    proc = subprocess.run(
        [str(kind.kubectl_binary()), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def stale_tag(cluster: DeployedCluster, tag: str, other_image: str) -> None:
    """Point ``tag`` at another image in every node's containerd."""
    client = dockerd.ensure().client()
    try:
        kind.tag(client, cluster.name, other_image, tag)
    finally:
        client.close()


def pod_ip(cluster: DeployedCluster, namespace: str, name: str) -> str:
    return str(cluster.kubectl_json("get", "pod", "-n", namespace, name)["status"]["podIP"])


def in_pod(cluster: DeployedCluster, namespace: str, name: str, script: str) -> str:
    return cluster.kubectl("exec", "-n", namespace, name, "--", "/bin/sh", "-c", script)


def responses(cluster: DeployedCluster, namespace: str) -> int:
    # The bodies end without a newline: count the status lines wherever they start.
    return int(in_pod(cluster, namespace, "flow", "grep -o 'HTTP/1.1 200 OK' /tmp/flow | wc -l"))


def test_a_rolling_update_and_back_keeps_flows_addresses_and_denials(
    deployed: tuple[DeployedCluster, dict[str, Any]],
) -> None:
    cluster, _ = deployed
    namespace = f"roll-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        eventually(  # pods are refused until the namespace's default ServiceAccount exists
            lambda: cluster.kubectl(
                "get", "serviceaccount", "default", "-n", namespace, check=False
            ),
            "the namespace's default ServiceAccount",
            timeout=120,
        )
        apply(
            cluster,
            pod("server", namespace, {"app": "server"}, SERVER),
            pod("denied", namespace, {"app": "denied"}, SERVER),
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "deny-to-denied", "namespace": namespace},
                "spec": {"podSelector": {"matchLabels": {"app": "denied"}}, "ingress": []},
            },
        )
        cluster.kubectl("wait", "--for=condition=Ready", "pod", "--all", "-n", namespace,
                        "--timeout=300s", timeout=330)  # fmt: skip
        server, denied = pod_ip(cluster, namespace, "server"), pod_ip(cluster, namespace, "denied")
        apply(
            cluster,
            pod("flow", namespace, {"app": "flow"}, FLOW.format(server=server)),
            pod("probe", namespace, {"app": "probe"}, PROBE.format(allowed=server, denied=denied)),
        )
        cluster.kubectl("wait", "--for=condition=Ready", "pod", "--all", "-n", namespace,
                        "--timeout=300s", timeout=330)  # fmt: skip
        addresses = {
            name: pod_ip(cluster, namespace, name) for name in ("server", "denied", "flow", "probe")
        }
        # Premises: the flow answers, the probe connects where it is allowed.
        eventually(lambda: responses(cluster, namespace) > 5, "the flow's answers", timeout=60)
        eventually(
            lambda: "allowed" in in_pod(cluster, namespace, "probe", "cat /tmp/probe"),
            "the probe's allowed connections",
            timeout=60,
        )
        original = cluster.agent_image()
        client = dockerd.ensure().client()
        try:
            next_image = daemonset.tagged_image(client, cluster.name, NEXT_TAG)
        finally:
            client.close()
        assert "@sha256:" in original, original
        for image in (next_image, original):  # the update, then back
            if image == original:
                # A stale image under the version's tag on the node (another build, an
                # old import): the pinned reference still runs sluice's own content.
                stale_tag(cluster, daemonset.sluice_image.image_name(), AGNHOST)
            before = responses(cluster, namespace)
            started_pod = f"during-{image.rsplit(':', 1)[1].replace('.', '-')}"
            cluster.kubectl("set", "image", "daemonset", "sluice-agent", "-n", "kube-system",
                            f"install={image}", f"agent={image}")  # fmt: skip
            # A pod created while the agent restarts waits (code 11, retried), then starts.
            apply(cluster, pod(started_pod, namespace, {"app": "late"}, SERVER))
            cluster.kubectl("rollout", "status", "daemonset", "sluice-agent", "-n", "kube-system",
                            "--timeout=600s", timeout=630)  # fmt: skip
            assert cluster.agent_image() == image
            if image == original:
                digest = original.split("@", 1)[1]
                for agent in cluster.agent_pods():
                    ids = [s["imageID"] for s in agent["status"]["containerStatuses"]]
                    assert all(i.endswith(digest) for i in ids), (ids, digest)
            cluster.kubectl("wait", "--for=condition=Ready", "pod", started_pod, "-n", namespace,
                            "--timeout=300s", timeout=330)  # fmt: skip
            flow = in_pod(cluster, namespace, "flow", "cat /tmp/flow")
            assert "CUT" not in flow, "the established flow was cut by the update"
            eventually(
                lambda before=before: responses(cluster, namespace) > before + 5,
                "the flow answering after the update",
                timeout=60,
            )
            probed = in_pod(cluster, namespace, "probe", "cat /tmp/probe")
            assert "DENIED-PASSED" not in probed, "a denied connection passed during the update"
            allowed = probed.count("allowed")
            eventually(  # the probe still runs, and what is allowed still connects
                lambda allowed=allowed: (
                    in_pod(cluster, namespace, "probe", "cat /tmp/probe").count("allowed") > allowed
                ),
                "the probe's allowed connections after the update",
                timeout=60,
            )
            assert {n: pod_ip(cluster, namespace, n) for n in addresses} == addresses
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
