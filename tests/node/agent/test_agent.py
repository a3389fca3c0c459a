"""The node agent as a process: forwarding, what happens without it, who may talk
to it, hostile requests, restarts under live traffic, concurrency, metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni.plugin import frames
from cni.plugin.client import forward
from tests.harness.agent import (
    AgentNetwork,
    PolicyPod,
    k8s_args,
    namespace,
    pod_object,
    policy,
)
from tests.harness.cni_run import PodNamespaces, exec_plugin, in_netns, sluicectl
from tests.harness.waiting import eventually


@pytest.fixture
def net(tmp_path: Path, bin_dir: Path) -> Iterator[AgentNetwork]:
    made = AgentNetwork.create(tmp_path, bin_dir)
    try:
        made.start()
        yield made
    finally:
        made.cleanup()


def wired(net: AgentNetwork, pods: PodNamespaces, ns: str, name: str) -> PolicyPod:
    netns = pods.new()
    cid = f"{ns}-{name}-{uuid.uuid4().hex[:6]}"
    result = net.add(netns, cid, ns, name)
    return PolicyPod(ns, name, cid, netns, result["ips"][0]["address"].split("/")[0])


def raw_request(path: str, payload: bytes) -> dict[str, Any] | None:
    """Send bytes as they are; the answer, or None when the agent hung up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(path)
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        try:
            return frames.receive(sock, frames.MAX_ANSWER)
        except (frames.FrameError, OSError):
            return None


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


# -- forwarding -------------------------------------------------------------------------------


def test_calls_are_served_by_the_agent(net: AgentNetwork, pods: PodNamespaces) -> None:
    netns = pods.new()
    result = net.add(netns, "c1", "x", "a")
    assert result["interfaces"][1]["sandbox"] == netns
    (endpoint,) = net.endpoints()
    assert endpoint["pod"] == "x/a" and endpoint["containerID"] == "c1"
    assert endpoint["ips"] == [result["ips"][0]["address"].split("/")[0]]
    check = net.network.config(
        result["cniVersion"], prevResult=result, policy="enforce", agentSocket=net.socket
    )
    net.network.run(
        "CHECK", check, container_id="c1", netns=netns, ifname="eth0", cni_args=k8s_args("x", "a")
    ).ok()
    net.network.run("STATUS", net.config()).ok()
    # Errors come back exactly as the plugin would print them.
    bad = net.network.run(
        "ADD",
        net.config(mtu="big"),
        container_id="c2",
        netns=netns,
        ifname="e1",
        cni_args=k8s_args("x", "b"),
    )
    assert bad.error_code == 7 and '"mtu"' in bad.out["details"]
    net.delete(netns, "c1", "x", "a")
    assert net.endpoints() == []
    # The agent logs the failure, with the call's fields on the line.
    lines = [json.loads(x) for x in net.agent.log().splitlines() if x.startswith("{")]
    failed = [x for x in lines if x.get("container_id") == "c2"]
    assert failed and failed[-1]["msg"].startswith("ADD failed: code 7"), failed
    assert (failed[-1]["verb"], failed[-1]["namespace"], failed[-1]["pod"]) == ("ADD", "x", "b")


def test_forwarding_loads_no_json(net: AgentNetwork, bin_dir: Path) -> None:
    """The executable forwards a call, with the configuration naming its agent socket,
    without loading json (it pulls in re), anything of the verbs, or even os and
    __future__ (the interpreter with -I -S starts without them)."""
    launcher = (bin_dir / "sluice").read_text()
    heavy = ("json", "re", "pyroute2", "cni.spec.protocol", "sqlite3", "os", "__future__", "typing")
    probe = launcher.replace(
        "sys.exit(main())",
        (
            "import posix\n"
            "import cni.plugin.main\n"
            "def finish(rc):\n"
            f"    heavy = [m for m in {heavy!r} if m in sys.modules]\n"
            "    print('HEAVY', heavy, 'RC', rc, flush=True)\n"
            "    posix._exit(rc)\n"
            "cni.plugin.main.finish = finish\n"
            "cni.plugin.main.main()\n"
        ),
    )
    script = bin_dir.parent / "forward-probe.py"
    script.write_text(probe)
    script.chmod(0o755)
    config = net.network.config("1.1.0", policy="enforce", agentSocket=net.socket)
    run = exec_plugin(script, "STATUS", config)
    assert "HEAVY [] RC 0" in run.stdout, run.stdout + run.stderr


def test_without_the_agent_enforced_networks_refuse_add_and_check(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    netns = pods.new()
    result = net.add(netns, "c1", "x", "a")
    net.stop()
    other = pods.new()
    refused = net.network.run("ADD", net.config(), container_id="c2", netns=other, ifname="eth0")
    assert refused.error_code == 11 and "agent" in refused.out["details"]
    assert net.network.allocations().keys() == {("c1", "eth0")}  # nothing allocated for c2
    check = net.network.config(
        result["cniVersion"], prevResult=result, policy="enforce", agentSocket=net.socket
    )
    checked = net.network.run("CHECK", check, container_id="c1", netns=netns, ifname="eth0")
    assert checked.error_code == 11
    status = net.network.run("STATUS", net.config())
    assert status.error_code == 50 and "agent" in status.out["details"]
    # DEL must always work: it runs in the plugin's own process.
    net.delete(netns, "c1", "x", "a")
    assert net.network.veths() == [] and net.network.allocations() == {}


def test_policy_off_networks_use_the_agent_when_it_is_there(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    config = net.network.config(policy="off", agentSocket=net.socket)
    first = pods.new()
    net.network.add(first, "c0", config=config, cni_args=k8s_args("x", "z"))
    net.network.delete(first, "c0", config=config).ok()
    # In-process ADDs may run beside the agent here, so its DEL releases before it
    # answers; only the veth's deletion comes after.
    assert net.network.allocations() == {} and net.network.masqueraded() == set()
    netns = pods.new()
    net.network.add(netns, "c1", config=config, cni_args=k8s_args("x", "a"))
    assert [e["pod"] for e in net.endpoints()] == ["x/a"]
    net.stop()  # without it, the same network still works on its own
    net.network.delete(netns, "c1", config=config).ok()
    other = pods.new()
    net.network.add(other, "c2", config=config)
    net.network.delete(other, "c2", config=config).ok()


def node_veth_state(net: AgentNetwork, cid: str) -> tuple[bool, bool] | None:
    """(up, routed to the pod) of the attachment's node-side veth; None once it is gone."""
    from cni.net import link, route
    from cni.net.netlink import node_socket
    from cni.spec.attachment import node_veth_name

    with node_socket() as node:
        veth = link.get_link(node, node_veth_name(net.network.name, cid, "eth0"))
        if veth is None:
            return None
        return veth.up, any(r.dst.endswith("/32") for r in route.routes(node, veth.index))


def test_del_answers_once_the_pair_is_cut_off_and_the_release_follows(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    netns = pods.new()
    net.add(netns, "c1", "x", "a")
    assert net.network.masqueraded() and node_veth_state(net, "c1") == (True, True)
    net.delete(netns, "c1", "x", "a")
    # When DEL answers, the pod is out of service: no endpoint, its veth down or gone,
    # no route to it.
    assert net.endpoints() == []
    assert node_veth_state(net, "c1") in (None, (False, False))
    # The rest follows without another call.
    eventually(
        lambda: (
            net.network.allocations() == {}
            and net.network.veths() == []
            and net.network.masqueraded() == set()
        ),
        "the release after DEL",
        timeout=20,
    )


def test_a_del_the_agent_died_after_answering_is_finished_at_its_next_start(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    netns = pods.new()
    net.add(netns, "c1", "x", "a")
    net.agent.stop(signal.SIGKILL)
    # What a DEL leaves when its agent dies right after answering: the pair down, the
    # address, its masquerade entry and the veth still there.
    veth = net.network.veths()[0]
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    assert net.network.allocations().keys() == {("c1", "eth0")}
    net.start()
    assert net.network.allocations() == {}
    assert net.network.veths() == [] and net.network.masqueraded() == set()
    assert net.endpoints() == []
    # The same attachment can be added again.
    net.add(netns, "c1", "x", "a")
    assert net.network.allocations().keys() == {("c1", "eth0")}
    net.delete(netns, "c1", "x", "a")


def test_an_add_into_a_full_pool_gets_the_address_of_an_answered_del(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    """DEL answers before its address is back in the pool; an ADD that finds the pool
    empty meanwhile waits for what DELs are still releasing instead of failing."""
    base = net.network.subnet.rsplit(".", 1)[0]
    ipam = {
        "type": "sluice-ipam",
        "subnet": net.network.subnet,
        "rangeStart": f"{base}.10",
        "rangeEnd": f"{base}.11",
    }
    config = net.config(ipam=ipam)
    first, second, third = pods.new(), pods.new(), pods.new()
    net.network.add(first, "c1", config=config, cni_args=k8s_args("x", "a"))
    net.network.add(second, "c2", config=config, cni_args=k8s_args("x", "b"))
    full = net.network.run("ADD", config, container_id="c0", netns=third, ifname="eth0")
    assert full.error_code == 102, full.out
    net.network.delete(first, "c1", config=config, cni_args=k8s_args("x", "a")).ok()
    result = net.network.add(third, "c3", config=config, cni_args=k8s_args("x", "c"))
    assert result["ips"][0]["address"].split("/")[0] in (f"{base}.10", f"{base}.11")
    for netns, cid in ((second, "c2"), (third, "c3")):
        net.network.delete(netns, cid, config=config).ok()


# -- who may talk to it, and what they may say ---------------------------------------------------


def test_the_socket_is_root_only_and_checks_peer_credentials(bin_dir: Path) -> None:
    # A work directory others may traverse, so that only the agent's own checks stand
    # between another user and the socket once its modes are loosened.
    work = Path(tempfile.mkdtemp(prefix="sluice-creds-"))
    work.chmod(0o755)
    net = AgentNetwork.create(work, bin_dir)
    try:
        net.start()
        info = os.stat(net.socket)
        assert info.st_mode & 0o777 == 0o600 and info.st_uid == 0
        directory = os.stat(os.path.dirname(net.socket))
        assert directory.st_mode & 0o777 == 0o700 and directory.st_uid == 0
        os.chmod(net.socket, 0o666)
        os.chmod(os.path.dirname(net.socket), 0o755)
        client = (
            "import socket, struct, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.connect(sys.argv[1])\n"
            'body = b\'{"v": 1, "op": "status"}\'\n'
            "try:\n"
            "    s.sendall(struct.pack('>I', len(body)) + body)\n"
            "    print(len(s.recv(100)))\n"
            "except (BrokenPipeError, ConnectionResetError):\n"
            "    print(0)\n"
        )
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        proc = subprocess.run(
            [*nobody, "/usr/bin/python3", "-c", client, net.socket],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "0"  # hung up without an answer
        assert "refused a connection" in net.agent.log()
        assert net.ask({"op": "status"})["ready"]
    finally:
        net.cleanup()
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (frame(b"not json"), "not JSON"),
        (frame(b"[1, 2]"), "not a JSON object"),
        (struct.pack(">I", frames.MAX_REQUEST + 1) + b"x" * 64, "over the limit"),
        (frame(b'{"v": 2, "op": "status"}'), "protocol version"),
        (frame(b'{"v": 1, "op": "reboot"}'), "unknown op"),
        (frame(b'{"v": 1, "op": "cni", "env": {}, "stdin": ""}'), "unknown op"),
        (frame(b"C\x00"), "too short"),
        (frame(struct.pack(">cII", b"C", 9, 0)), "protocol version"),
        (frame(struct.pack(">cII", b"C", 1, 1000) + b"CNI_COMMAND=ADD\0"), "overruns"),
        (frame(struct.pack(">cII", b"C", 1, 8) + b"NOEQUAL\0{}"), "not KEY=VALUE"),
        (frame(struct.pack(">cII", b"C", 1, 5) + b"=ADD\0{}"), "not KEY=VALUE"),
        (frame(struct.pack(">cII", b"C", 1, 3) + b"A=B\0{}"), "end with a NUL"),
        (frame(b'{"v": 1, "op": "apply", "manifest": 7}'), "manifest"),
        (frame(b'{"v": 1, "op": "explain", "pod": "no-slash"}'), "NAMESPACE/NAME"),
        (b"\x00\x00", None),  # a truncated header: no answer
    ],
)
def test_hostile_requests_get_errors_and_change_nothing(
    net: AgentNetwork, payload: bytes, fragment: str | None
) -> None:
    answer = raw_request(net.socket, payload)
    if fragment is None:
        assert answer is None or "error" in answer
    else:
        assert answer is not None and fragment in answer.get("error", ""), answer
    assert net.ask({"op": "status"})["ready"]  # still serving
    assert net.endpoints() == []


def test_a_cni_call_with_hostile_input_gets_the_cni_error(net: AgentNetwork) -> None:
    for env, stdin, code in (
        ({"CNI_COMMAND": "ADD"}, b"{", 6),
        ({"CNI_COMMAND": "FORMAT"}, b"{}", 4),
        (
            {
                "CNI_COMMAND": "ADD",
                "CNI_CONTAINERID": "x",
                "CNI_NETNS": "/proc/1/ns/net",
                "CNI_IFNAME": "eth0",
            },
            json.dumps(net.config()).encode(),
            4,
        ),
    ):
        rc, out, _ = forward(net.socket, env, stdin)
        assert rc == 1 and json.loads(out)["code"] == code, out


def test_an_environment_that_is_not_utf8_gets_code_4_and_leaves_nothing(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    """The executable forwards the environment as the kernel gave it; a pod name of
    bytes that are not UTF-8 (or with a terminal escape) is refused at the edge, before
    anything is allocated, not by the store midway through an ADD."""
    for name in ("\udcff\udcfe", "a\x1b[2Jb"):  # what os.environ makes of such bytes
        netns = pods.new()
        refused = net.network.run(
            "ADD",
            net.config(),
            container_id="c1",
            netns=netns,
            ifname="eth0",
            cni_args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=x;K8S_POD_NAME={name}",
        )
        assert refused.error_code == 4 and "K8S_POD_NAME" in refused.out["msg"] + str(
            refused.out.get("details")
        ), refused.out
    assert net.network.veths() == [] and net.network.allocations() == {}
    assert net.endpoints() == []
    assert net.ask({"op": "status"})["ready"]  # still serving


# -- no window, restarts, concurrency ------------------------------------------------------


def test_a_new_pod_is_isolated_before_its_first_packet(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    net.apply(
        namespace("x", ns="x"),
        policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"]),
    )
    client = wired(net, pods, "y", "client")
    # While the pod is being added, the client hammers the whole subnet on port 80:
    # the new pod's server must never see a connection.
    stop = threading.Event()
    hammer = (
        "import ipaddress, socket, sys, time\n"
        "net = ipaddress.ip_network(sys.argv[1])\n"
        "while True:\n"
        "    for ip in list(net.hosts())[:40]:\n"
        "        s = socket.socket(); s.setblocking(False)\n"
        "        try: s.connect((str(ip), 80))\n"
        "        except OSError: pass\n"
        "        s.close()\n"
        "    time.sleep(0.01)\n"
    )
    hammering = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            Path(client.netns).name,
            "/usr/bin/python3",
            "-c",
            hammer,
            net.network.subnet,
        ]
    )
    try:
        netns = pods.new()
        listener = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                Path(netns).name,
                "/usr/bin/python3",
                "-c",
                "import socket, sys\n"
                "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                "s.bind(('0.0.0.0', 80)); s.listen(64); s.settimeout(4)\n"
                "print('ready', flush=True)\n"
                "try:\n    s.accept(); print('accepted')\nexcept OSError:\n    print('nothing')\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        net.add(netns, "victim", "x", "victim")
        out, _ = listener.communicate(timeout=20)
        assert out.strip() == "nothing"
    finally:
        stop.set()
        hammering.kill()
        hammering.wait()


def test_restart_keeps_enforcing_and_established_flows(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    net.apply(
        namespace("x", ns="x"),
        namespace("y", ns="y"),
        pod_object("x", "server", app="server"),
        pod_object("y", "friend", app="friend"),
        policy(
            "x",
            "friends-only",
            podSelector={"matchLabels": {"app": "server"}},
            policyTypes=["Ingress"],
            ingress=[
                {
                    "from": [
                        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "friend"}}}
                    ]
                }
            ],
        ),
    )
    server = wired(net, pods, "x", "server")
    friend = wired(net, pods, "y", "friend")
    stranger = wired(net, pods, "y", "stranger")
    server.serve()
    try:
        held = HeldFlow(friend, server.ip)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            net.agent.stop(sig)
            # Nobody home: the pinned datapath keeps judging.
            assert stranger.reaches([(server.ip, 80, "tcp")]) == [False]
            assert friend.reaches([(server.ip, 80, "tcp")]) == [True]
            assert held.echo()
            net.start()
            assert stranger.reaches([(server.ip, 80, "tcp")]) == [False]
            assert friend.reaches([(server.ip, 80, "tcp")]) == [True]
            assert held.echo()
            assert {e["pod"] for e in net.endpoints()} == {"x/server", "y/friend", "y/stranger"}
            assert all(not e["pending"] for e in net.endpoints())
        held.close()
    finally:
        server.stop_serving()


class HeldFlow:
    """A TCP connection kept open; ``echo`` sends a byte and expects it back."""

    SCRIPT = (
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], 80), timeout=3)\n"
        "print('up', flush=True)\n"
        "for line in sys.stdin:\n"
        "    try:\n"
        "        s.sendall(b'x'); ok = s.recv(1) == b'x'\n"
        "    except OSError:\n"
        "        ok = False\n"
        "    print('ok' if ok else 'lost', flush=True)\n"
    )

    def __init__(self, client: PolicyPod, address: str) -> None:
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                Path(client.netns).name,
                "/usr/bin/python3",
                "-c",
                self.SCRIPT,
                address,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "up"

    def echo(self) -> bool:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_concurrent_adds_and_policy_changes_leave_every_pod_with_its_policy(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    count = 100
    net.apply(namespace("x", ns="x"), namespace("y", ns="y"))
    netnses = [pods.new() for _ in range(count)]
    names = [f"p{i}" for i in range(count)]

    def add(i: int) -> None:
        ns = "x" if i % 2 else "y"
        net.add(netnses[i], f"c{i}", ns, names[i])

    def churn_policies() -> None:
        for round_ in range(20):
            net.apply(
                pod_object("x", names[round_ * 2 + 1], role="db" if round_ % 2 else "web"),
                policy(
                    "x",
                    "db",
                    podSelector={"matchLabels": {"role": "db"}},
                    ingress=[{"from": [{"podSelector": {"matchLabels": {"role": "web"}}}]}],
                ),
                policy(
                    "y",
                    f"deny-{round_ % 3}",
                    podSelector={},
                    policyTypes=["Egress"] if round_ % 2 else ["Ingress"],
                ),
            )

    churner = threading.Thread(target=churn_policies)
    churner.start()
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(add, range(count)))
    churner.join()
    # Every endpoint ends with exactly the policy computed from the final state.
    deadline = time.monotonic() + 60
    while any(e["pending"] for e in net.endpoints()) and time.monotonic() < deadline:
        time.sleep(0.2)
    endpoints = {e["pod"]: e for e in net.endpoints()}
    assert len(endpoints) == count
    assert not [p for p, e in endpoints.items() if e["pending"]]
    for i in range(count):
        ns = "x" if i % 2 else "y"
        explained = net.ask({"op": "explain", "pod": f"{ns}/{names[i]}"})["explanation"]
        endpoint = endpoints[f"{ns}/{names[i]}"]
        assert endpoint["ingressIsolated"] == explained["ingress"]["isolated"], endpoint
        assert endpoint["egressIsolated"] == explained["egress"]["isolated"], endpoint
    answer = net.ask({"op": "apply", "manifest": ""})
    assert "error" not in answer
    for i in range(count):
        net.delete(netnses[i], f"c{i}", "x" if i % 2 else "y", names[i])
    assert net.endpoints() == []


def test_a_manifest_over_the_request_limit_is_refused_before_it_is_sent(
    net: AgentNetwork, tmp_path: Path
) -> None:
    """One policy with 100,000 ipBlock CIDRs (a blocklist): sluicectl names the limit and
    sends nothing (the agent would close the socket mid-send: a broken pipe), and the
    agent goes on serving."""
    blocked = [{"cidr": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}/32"} for i in range(100000)]
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "blocklist", "namespace": "x"},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": blocked}}]}],
        },
    }
    manifest = tmp_path / "blocklist.json"
    manifest.write_text(json.dumps(policy))
    before = net.agent.log()
    proc = sluicectl("apply", "-f", manifest, "--conf", net.conflist)
    assert proc.returncode == 1, proc
    assert f"over the agent's limit of {frames.MAX_REQUEST} bytes" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr
    assert "over the limit" not in net.agent.log()[len(before) :], "nothing reached the agent"
    assert net.ask({"op": "status"})["ready"]
    assert net.ask({"op": "get", "what": "policies"})["policies"] == []


# -- metrics -------------------------------------------------------------------------------------


def test_metrics(tmp_path: Path, bin_dir: Path, pods: PodNamespaces) -> None:
    made = AgentNetwork.create(tmp_path, bin_dir)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    made.agent.extra = ("--metrics-address", f"127.0.0.1:{port}")
    try:
        made.start()
        netns = pods.new()
        made.add(netns, "c1", "x", "a")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        metrics = text.decode()
        for name in (
            'sluice_cni_duration_seconds_count{result="ok",verb="ADD"}',
            "sluice_policy_duration_seconds_bucket",
            'sluice_ipam_allocated_addresses{network="',
            'sluice_ipam_free_addresses{network="',
            "sluice_ipam_largest_free_block_addresses",
            'sluice_datapath_packets_total{direction="egress"',
            'sluice_datapath_map_entries{map="endpoints"}',
            'sluice_conntrack_capacity_entries{namespace="x",pod="a"}',
            'sluice_conntrack_entries{namespace="x",pod="a"}',
            "sluice_build_info{",
            "process_resident_memory_bytes",
        ):
            assert name in metrics, name
        assert "ifindex=" not in metrics, "a series per ifindex"
        made.delete(netns, "c1", "x", "a")
    finally:
        made.cleanup()


def test_probe_helper_sees_the_pods_own_address(net: AgentNetwork, pods: PodNamespaces) -> None:
    pod = wired(net, pods, "x", "a")
    assert pod.ip in in_netns(pod.netns, "ip", "-4", "-o", "addr").stdout
