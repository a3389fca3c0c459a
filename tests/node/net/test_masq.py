"""The masquerade table: it goes with the network's last pod, and a DEL that drops
it never loses an element a concurrent ADD put in."""

from __future__ import annotations

import ipaddress
import json
import threading
import uuid
from pathlib import Path

from cni.net import masq
from tests.harness.cni_run import Network, PodNamespaces, preload_datapath, sluice_networks

CLUSTER = ipaddress.IPv4Network("10.0.0.0/8")


def test_the_last_pods_del_drops_the_table(
    network: Network, pods: PodNamespaces, tmp_path: Path
) -> None:
    conflist = tmp_path / "net.conflist"
    plugin = {k: v for k, v in network.config().items() if k not in ("name", "cniVersion")}
    conflist.write_text(
        json.dumps({"cniVersion": "1.1.0", "name": network.name, "plugins": [plugin]})
    )
    preload_datapath(conflist)
    ns_a, ns_b = pods.new(), pods.new()
    network.add(ns_a, "a")
    network.add(ns_b, "b")
    network.delete(ns_a, "a").ok()
    assert network.name in sluice_networks()  # b still masquerades
    network.delete(ns_b, "b").ok()
    assert network.name not in sluice_networks()
    network.delete(ns_b, "b").ok()  # again: nothing left to remove is fine


def test_a_del_dropping_the_table_never_loses_a_concurrent_adds_element() -> None:
    """Two pods come and go over and over; each checks its address is in the set right
    after its ADD. Without the lock, a DEL that found the set empty deletes the table
    after the other's ADD has put its element in."""
    name = f"tm{uuid.uuid4().hex[:7]}"
    rounds = 150
    lost: list[str] = []
    start = threading.Barrier(2)

    def churn(ip: str) -> None:
        start.wait()
        for _ in range(rounds):
            masq.add(name, CLUSTER, [ip])
            if not masq.contains(name, ip):
                lost.append(ip)
            masq.remove(name, [ip])

    threads = [threading.Thread(target=churn, args=(ip,)) for ip in ("10.9.0.1", "10.9.0.2")]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not lost, f"{len(lost)} of {2 * rounds} ADDs lost their element"
        assert name not in sluice_networks()
    finally:
        masq.drop(name)
