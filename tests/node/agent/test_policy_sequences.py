"""Policy stays right while the cluster changes: sequences of changes on the real
cluster, every pod pair probed on every served port after each step (through pod
addresses and through ClusterIPs, counted at the receiving pod), compared with an
oracle written from the NetworkPolicy specification (``tests.harness.netpol_oracle``),
and ``sluicectl datapath verify`` run after every step (``tests.harness.policy_fuzz``).

- random sequences, seeded (``SLUICE_SEQUENCE_SEED``; the seed is printed), in both
  resolver modes; ``make policy-fuzz`` runs them for as long as it is given;
- the sequences reported against sluice (a pod appearing in the policy's own
  namespace, a new namespace, a relabelled peer) and their mirror images (ingress
  instead of egress, peers that stop matching), fixed;
- a probe loop throughout a change sees only the old or the new verdict.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.cluster import Cluster
from tests.harness.controller import controller_mode
from tests.harness.policy_fuzz import SequenceRunner, random_sequences
from tests.harness.policy_sequences import Step

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

SEQUENCES = int(os.environ.get("SLUICE_SEQUENCES", "2"))
LENGTH = int(os.environ.get("SLUICE_SEQUENCE_LENGTH", "8"))


@pytest.fixture(scope="module", params=["agent", "controller"])
def runner(
    request: pytest.FixtureRequest, k8s_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SequenceRunner]:
    """The base pods on the session's cluster, its agent resolving by itself, then (the
    module's second half) through ``sluicectl controller``."""
    mode = (
        controller_mode(k8s_cluster, tmp_path_factory.mktemp("controllers"))
        if request.param == "controller"
        else contextlib.nullcontext()
    )
    with mode:
        runner = SequenceRunner(k8s_cluster)
        runner.mode = request.param  # type: ignore[attr-defined]
        try:
            runner.setup()
            yield runner
        finally:
            runner.destroy()


def test_random_sequences_match_the_specification(
    runner: SequenceRunner, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = int(os.environ.get("SLUICE_SEQUENCE_SEED") or random.randrange(1 << 20))
    started = time.monotonic()
    before = (runner.tally.sequences, runner.tally.steps, runner.tally.probes)
    failures = random_sequences(runner, seed, SEQUENCES, LENGTH)
    tally = runner.tally
    with capsys.disabled():  # seed and tally in the session's output, passed or not
        print(
            f"\n[policy sequences] {runner.mode} mode: seed {seed} "  # type: ignore[attr-defined]
            f"(SLUICE_SEQUENCE_SEED={seed} replays it): {tally.sequences - before[0]} "
            f"sequences, {tally.steps - before[1]} steps, {tally.probes - before[2]} probes "
            f"in {time.monotonic() - started:.0f} s, {len(failures)} wrong"
        )
    assert not failures, "\n\n".join(failures)


# -- the reported sequences and their mirrors ---------------------------------------------


def _in(key: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}


TCP_80 = [{"port": 80, "protocol": "TCP"}]
DNS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
EGRESS_TO_A_B_OF_Y_Z = [
    {
        "to": [{"namespaceSelector": _in("ns", "y", "z"), "podSelector": _in("pod", "a", "b")}],
        "ports": TCP_80,
    },
    {"ports": DNS},
]
BASE = {
    "podSelector": {"matchLabels": {"pod": "a"}},
    "policyTypes": ["Ingress", "Egress"],
    "ingress": [
        {
            "from": [
                {"namespaceSelector": _in("ns", "x", "y"), "podSelector": _in("pod", "b", "c")}
            ],
            "ports": TCP_80,
        }
    ],
    "egress": EGRESS_TO_A_B_OF_Y_Z,
}
NEW_LABEL = {
    "podSelector": {"matchLabels": {"pod": "a"}},
    "policyTypes": ["Ingress", "Egress"],
    "ingress": [
        {
            "from": [
                {
                    "namespaceSelector": _in("ns", "y", "z"),
                    "podSelector": {"matchLabels": {"new-label": "abc"}},
                }
            ],
            "ports": TCP_80,
        }
    ],
    "egress": EGRESS_TO_A_B_OF_Y_Z,
}
INGRESS_FROM_A_B_OF_Y_Z = {
    "podSelector": {"matchLabels": {"pod": "a"}},
    "policyTypes": ["Ingress"],
    "ingress": [
        {
            "from": [
                {"namespaceSelector": _in("ns", "y", "z"), "podSelector": _in("pod", "a", "b")}
            ],
            "ports": TCP_80,
        },
        {"ports": DNS},
    ],
}


def policy(spec: dict[str, Any], ns: str = "x", name: str = "base") -> Step:
    return {"op": "policy", "ns": ns, "name": name, "spec": spec}


def pod(ns: str, name: str, **labels: str) -> Step:
    return {"op": "pod", "ns": ns, "pod": name, "labels": {"pod": name, **labels}, "ports": "std"}


REPORTED: dict[str, list[Step]] = {
    # x/a, egress TCP 80 to a and b of y and z plus DNS anywhere, reached a new x/d everywhere.
    "egress-to-a-new-pod-in-its-namespace": [policy(BASE), pod("x", "d")],
    # ... and a new namespace with y's labels on TCP 81 and UDP (only TCP 80 may pass).
    "egress-to-a-new-namespace": [
        policy(BASE),
        {"op": "namespace", "ns": "w", "labels": {"ns": "y"}},
        pod("w", "a"),
        pod("w", "b"),
    ],
    # ... and y/b, once it had new-label=abc (an ingress rule's peer), on every port.
    "egress-to-a-relabelled-peer": [
        policy(NEW_LABEL),
        pod("y", "b", **{"new-label": "abc"}),
        pod("y", "b"),
        pod("y", "b", **{"new-label": "abc"}),
    ],
    # Mirrors: the same changes seen by ingress rules.
    "ingress-from-a-new-pod": [policy(INGRESS_FROM_A_B_OF_Y_Z), pod("x", "d"), pod("y", "d")],
    "ingress-from-a-new-namespace": [
        policy(INGRESS_FROM_A_B_OF_Y_Z),
        {"op": "namespace", "ns": "w", "labels": {"ns": "y"}},
        pod("w", "a"),
        pod("w", "c"),
    ],
    "ingress-from-a-relabelled-peer": [
        policy(NEW_LABEL),
        pod("z", "b", **{"new-label": "abc"}),
        pod("z", "b"),
    ],
    # Peers that stop matching: a pod relabelled, a namespace relabelled, a pod gone.
    "a-peer-that-stops-matching": [
        policy(BASE),
        policy(INGRESS_FROM_A_B_OF_Y_Z, "z", "from-a-b"),
        pod("y", "a", tier="1"),
        pod("y", "c"),
        {"op": "pod", "ns": "y", "pod": "a", "labels": {"pod": "c"}, "ports": "std"},
        {"op": "namespace", "ns": "z", "labels": {"ns": "q"}},
        {"op": "delete-pod", "ns": "y", "pod": "b"},
    ],
}


@pytest.mark.parametrize("case", sorted(REPORTED))
def test_reported_sequences_and_their_mirrors(runner: SequenceRunner, case: str) -> None:
    if runner.mode != "agent":  # type: ignore[attr-defined]
        pytest.skip("run in agent mode; controller mode runs the random sequences")
    problem = runner.run_sequence(REPORTED[case], shrink_budget=0)
    assert problem is None, problem


# -- no window -----------------------------------------------------------------------------------


def test_a_probe_loop_sees_only_the_old_or_the_new_verdict(runner: SequenceRunner) -> None:
    """While a peer starts, is relabelled and goes away, x/a probes it and another pod
    without pause on ports whose verdict is deny before and after every change (TCP 81,
    UDP 80 under BASE) and on TCP 80 (allowed only while the peer matches): a deny-deny
    port is never reached, TCP 80 only while allowed."""
    runner.run_sequence([policy(BASE)], shrink_budget=0)
    source = runner.pods[("x", "a")]
    stop = threading.Event()
    seen: list[tuple[float, str, int, str, str, bool]] = []

    def loop() -> None:
        while not stop.is_set():
            targets = []
            names = []
            for key in (("y", "d"), ("y", "b")):
                peer = runner.pods.get(key)
                if peer is None:
                    continue
                for address in (peer.ip, peer.cluster_ip):
                    for port, proto in ((80, "tcp"), (81, "tcp"), (80, "udp")):
                        targets.append((address, port, proto))
                        names.append((key[1], port, proto, address))
            if not targets:
                time.sleep(0.05)
                continue
            results = source.reaches(targets, 0.3)
            now = time.monotonic()
            for (name, port, proto, address), ok in zip(names, results, strict=True):
                seen.append((now, name, port, proto, address, ok))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    marks: list[tuple[float, str]] = []
    try:
        for step in (
            pod("y", "d", role="new"),  # starts matching `pod in (a, b)`? no: pod=d
            {
                "op": "pod",
                "ns": "y",
                "pod": "d",
                "labels": {"pod": "a"},
                "ports": "std",
            },  # now it does
            {
                "op": "pod",
                "ns": "y",
                "pod": "d",
                "labels": {"pod": "d"},
                "ports": "std",
            },  # not again
            {"op": "delete-pod", "ns": "y", "pod": "d"},
        ):
            marks.append((time.monotonic(), str(step)))
            for effect in runner.world.effects(step):
                runner.do(effect)
            time.sleep(3)
    finally:
        stop.set()
        thread.join(timeout=30)
    wider = [s for s in seen if s[5] and not (s[2] == 80 and s[3] == "tcp")]
    assert not wider, f"reached on a port denied before and after every change: {wider[:5]}"
    # TCP 80 to y/d: only between the relabel to pod=a and the relabel back (plus the
    # time the agent takes to see each), never before the first.
    first_allowed = marks[1][0]
    early = [
        s
        for s in seen
        if s[1] == "d" and s[2] == 80 and s[3] == "tcp" and s[5] and s[0] < first_allowed
    ]
    assert not early, f"y/d reached on TCP 80 before it matched: {early[:5]}"
    assert any(s[1] == "d" and s[5] for s in seen), (
        "y/d was never reached on TCP 80 while it matched"
    )
    print(f"{len(seen)} probes during the changes")
