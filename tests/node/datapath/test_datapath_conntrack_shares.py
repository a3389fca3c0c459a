"""One pod cannot evict another's flows: the flows a pod opens and the flows opened
toward it live in separate conntrack tables (bpf/sluice.h), so a peer its ingress
allows, opening UDP flows to it by the thousand, evicts only other inbound flows and
never the entries that let the answers to the pod's own questions back in.

Real packets between pods wired by the plugin: a asks c some questions on UDP 53
(each from its own port, as a resolver does), b opens FLOWS new flows to a, then c
answers. a takes nothing but b's traffic and its answers, so an answer whose entry
was evicted is dropped. With one table per endpoint no answer came back (0 of 5), nor
in the mirror (a's own flood evicted the flows c opened to it)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.datapath import policy_install as P
from cni.datapath.maps import Datapath
from cni.datapath.structs import ip_be
from cni.policy.vocabulary import EndpointPolicy
from tests.harness.cni_run import TEST_BPF_DIR, Network, PodNamespaces, in_netns
from tests.harness.datapath_pods import PYTHON, Pod, allow, rule, wired_pods

TABLE = 64  # entries of each of a's tables: small, so the flood fills them many times over
FLOWS = 20000  # the flood: new flows, one datagram each
QUESTIONS = 5

# Takes QUESTIONS questions, says so, and answers them all when told (a slow upstream).
ANSWERER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 53))
    print("ready", flush=True)
    askers = [s.recvfrom(64)[1] for _ in range(int(sys.argv[1]))]
    print("asked", flush=True)
    sys.stdin.readline()
    for asker in askers:
        s.sendto(b"answer", asker)
    """
)

# QUESTIONS questions, each from its own socket (its own flow); how many answered.
ASKER = textwrap.dedent(
    """
    import json, socket, sys, time
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(int(sys.argv[2]))]
    for s in sockets:
        s.sendto(b"ask", (sys.argv[1], 53))
    deadline, answered = time.monotonic() + 10, 0
    for s in sockets:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            answered += s.recv(64) == b"answer"
        except TimeoutError:
            pass
    print(json.dumps(answered), flush=True)
    """
)

# FLOWS new flows to the target, one datagram each from a port of its own.
FLOODER = textwrap.dedent(
    """
    import socket, sys
    target = (sys.argv[1], 9000)
    for i in range(int(sys.argv[2])):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("0.0.0.0", 20000 + i))
            s.sendto(b"x", target)
    """
)


@pytest.fixture
def trio(network: Network, pods: PodNamespaces) -> Iterator[list[Pod]]:
    with wired_pods(network, pods, "abc") as made:
        yield made


@pytest.fixture
def dp() -> Iterator[Datapath]:
    with Datapath(TEST_BPF_DIR) as datapath:
        yield datapath


def in_pod(pod: Pod, script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", Path(pod.netns).name, PYTHON, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def answered_after_a_flood(asker: Pod, server: Pod, flooder: Pod, target: Pod) -> int:
    """``asker`` asks ``server``, ``flooder`` floods ``target``, ``server`` answers:
    how many answers reached ``asker``."""
    answerer = in_pod(server, ANSWERER, QUESTIONS)
    questions: subprocess.Popen[str] | None = None
    try:
        assert answerer.stdout is not None and answerer.stdout.readline().strip() == "ready"
        questions = in_pod(asker, ASKER, server.ip, QUESTIONS)
        assert answerer.stdout.readline().strip() == "asked", "the questions reached the server"
        flood = in_netns(flooder.netns, PYTHON, "-c", FLOODER, target.ip, str(FLOWS), timeout=120)
        assert flood.returncode == 0, flood.stderr
        answerer.communicate(input="\n", timeout=10)
        out, _ = questions.communicate(timeout=30)
        return int(json.loads(out))
    finally:
        for proc in (answerer, questions):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_an_inbound_flood_keeps_the_answers_to_the_pods_questions(
    trio: list[Pod], dp: Datapath
) -> None:
    a, b, c = trio
    # a takes only b's traffic (and answers to what it asked); its egress is open.
    P.install(dp, a.ifindex, EndpointPolicy(ingress=allow(rule(f"{b.ip}/32"))))
    dp.conntrack.create_table(a.ifindex, TABLE)
    answered = answered_after_a_flood(a, c, b, a)
    fill = dp.conntrack.fill(a.ifindex)
    # The premise: the flood opened its flows into a, far more than a table holds.
    assert fill is not None and fill.created >= FLOWS and fill.evicted >= FLOWS - 2 * TABLE
    assert answered == QUESTIONS, f"{QUESTIONS - answered} of {QUESTIONS} answers dropped"
    inbound = dp.conntrack.flows(a.ifindex, inbound=True)
    assert inbound and all(key.daddr == ip_be(a.ip) for key, _ in inbound), "b's flows, in"


def test_an_outbound_flood_keeps_the_flows_opened_toward_the_pod(
    trio: list[Pod], dp: Datapath
) -> None:
    """The mirror: a pod that opens flows by the thousand evicts only its own outbound
    flows, never one a peer opened to it (whose answers a's egress would refuse)."""
    a, b, c = trio
    # a may send only to b (and answer what it was asked); c may ask a.
    P.install(dp, a.ifindex, EndpointPolicy(egress=allow(rule(f"{b.ip}/32"))))
    dp.conntrack.create_table(a.ifindex, TABLE)
    answered = answered_after_a_flood(c, a, a, b)
    fill = dp.conntrack.fill(a.ifindex)
    assert fill is not None and fill.created >= FLOWS
    assert answered == QUESTIONS, f"{QUESTIONS - answered} of {QUESTIONS} answers dropped"
