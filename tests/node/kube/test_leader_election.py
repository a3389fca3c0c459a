"""Leader election that cannot split: two real controllers (``Controller``, each with
a client of its own) against a real API server, one of them failing.

A sampler reads both controllers' ``leading`` every 10 ms while the test changes a
pod's labels twice a second (so that whoever leads writes an AddressSet each time),
and every write of a ``sluice.dev`` object is recorded with its start and end. The
proof: no sample where both lead, no write started by one while the other led, no
write of the old leader that succeeded after the new one began to lead; and the
survivor takes over.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni.controller.controller import Controller
from cni.kube import kubeconfig
from cni.kube.api import Api
from cni.policy.model import (
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PolicyRule,
    labels_of,
)
from tests.harness.api_proxy import (
    TcpProxy,
    kubeconfig_server,
    kubeconfig_token,
    proxied_kubeconfig,
)
from tests.harness.cluster import Cluster
from tests.harness.k8s_objects import create_world, pod_path
from tests.harness.waiting import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

# Leader election timings as tests/harness/controller.py has them, with more margin.
LEASE, RENEW_DEADLINE, RETRY = 6.0, 4.0, 0.5
SAMPLE_SECONDS = 0.01


@dataclass(frozen=True)
class Written:
    began: float
    ended: float
    ok: bool


class RecordingApi(Api):
    """The client, recording when each write of a sluice.dev object began and ended."""

    def __init__(self, config: str) -> None:
        super().__init__(config)
        self.writes: list[Written] = []

    def _recorded(self, path: str, call: Any) -> Any:
        if "/sluice.dev/" not in path:
            return call()
        began = time.monotonic()
        ok = False
        try:
            result = call()
            ok = True
            return result
        finally:
            self.writes.append(Written(began, time.monotonic(), ok))

    def create(self, path: str, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self._recorded(path, lambda: super(RecordingApi, self).create(path, obj, **kw))

    def replace(self, path: str, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self._recorded(path, lambda: super(RecordingApi, self).replace(path, obj, **kw))

    def patch(self, path: str, patch: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self._recorded(path, lambda: super(RecordingApi, self).patch(path, patch, **kw))

    def delete(self, path: str, **kw: Any) -> None:
        return self._recorded(path, lambda: super(RecordingApi, self).delete(path, **kw))


@dataclass
class Contender:
    name: str
    api: RecordingApi
    controller: Controller
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Contender:
        self.thread = threading.Thread(
            target=self.controller.run, args=(self.stopping,), name=self.name, daemon=True
        )
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=60)
        self.api.close()

    def successful_writes_after(self, moment: float) -> list[Written]:
        return [w for w in self.api.writes if w.ok and w.began >= moment]


class Sampler:
    """``leading`` of both contenders, every 10 ms, in one loop."""

    def __init__(self, a: Contender, b: Contender) -> None:
        self.a, self.b = a, b
        self.samples: list[tuple[float, bool, bool]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            a, b = self.a.controller.leading, self.b.controller.leading
            self.samples.append((time.monotonic(), a, b))
            time.sleep(SAMPLE_SECONDS)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def leading_moments(self, which: str) -> list[float]:
        index = 1 if which == "a" else 2
        return [s[0] for s in self.samples if s[index]]

    def check_no_split(self) -> None:
        both = [s[0] for s in self.samples if s[1] and s[2]]
        assert not both, f"both controllers led at {len(both)} samples, first at {both[0]:.2f}"
        for mine, other in ((self.a, "b"), (self.b, "a")):
            theirs = self.leading_moments(other)
            clash = [
                w for w in mine.api.writes if any(w.began <= t <= w.ended and w.ok for t in theirs)
            ]
            assert not clash, f"{mine.name} wrote while the other led: {clash[:3]}"


class Toggler:
    """Relabels a pod twice a second: it moves in and out of an AddressSet."""

    def __init__(self, api: Api, namespace: str, pod: str) -> None:
        self.api, self.path = api, pod_path(namespace, pod)
        self.running = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="toggler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        flip = False
        while not self.stopping.is_set():
            if self.running.wait(0.1):
                flip = not flip
                self.api.patch(
                    self.path, {"metadata": {"labels": {"app": "client" if flip else "other"}}}
                )
                self.stopping.wait(0.5)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


@pytest.fixture
def world(kube_control_plane: Cluster) -> Iterator[tuple[str, Api]]:
    """A namespace with a server pod, a client pod, and a policy that lets clients in."""
    name = f"le{uuid.uuid4().hex[:6]}"
    api = Api(str(kube_control_plane.kubeconfig))
    node = f"{name}-node"
    web = labels_of({"app": "web"})
    create_world(
        api,
        [node],
        [Namespace(name, labels_of({"kubernetes.io/metadata.name": name}))],
        [
            Pod(name, "server", web, ("10.77.0.1",), node),
            Pod(name, "client", labels_of({"app": "client"}), ("10.77.0.2",), node),
        ],
        [
            NetworkPolicy(
                name,
                "clients-in",
                LabelSelector(web),
                ingress=(
                    PolicyRule((Peer(pod_selector=LabelSelector(labels_of({"app": "client"}))),)),
                ),
            )
        ],
    )
    yield name, api
    cluster = kube_control_plane
    cluster.kubectl(
        "delete", "pods", "--all", "-n", name, "--grace-period=0", "--force", check=False
    )
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
    cluster.kubectl("delete", "node", node, "--ignore-not-found")
    cluster.kubectl("delete", "addresssets,policytargets", "--all")
    cluster.kubectl("delete", "lease", "-n", "default", name, "--ignore-not-found")
    api.close()


def contender(name: str, config: Path, lease_name: str) -> Contender:
    api = RecordingApi(str(config))
    controller = Controller(
        api,
        lease_namespace="default",
        lease_name=lease_name,
        identity=name,
        lease=LEASE,
        renew_deadline=RENEW_DEADLINE,
        retry=RETRY,
    )
    return Contender(name, api, controller)


def failing_once_plugin(tmp_path: Path, token: str) -> tuple[Path, Path]:
    """A credential plugin whose tokens last 2 s, and which fails once, the next time
    it runs after the returned flag file is created."""
    flag = tmp_path / "fail-next"
    script = tmp_path / "credential-plugin"
    script.write_text(
        "#!/bin/sh\n"
        f"if [ -e {flag} ]; then rm -f {flag}; echo 'refusing, once' >&2; exit 1; fi\n"
        "expiry=$(date -u -d '+2 seconds' +%Y-%m-%dT%H:%M:%SZ)\n"
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        f'"status":{{"token":"{token}","expirationTimestamp":"%s"}}}}\' "$expiry"\n'
    )
    script.chmod(0o755)
    return script, flag


def lead_then_standby(a: Contender, b: Contender) -> None:
    a.start()
    eventually(lambda: a.controller.leading and a.controller.synced(), "a leads", timeout=60)
    eventually(lambda: a.controller.written["created"] > 0, "a publishes", timeout=60)
    b.start()
    eventually(b.controller.synced, "b watches", timeout=60)


def test_a_credential_plugin_that_fails_once_does_not_split_leadership(
    kube_control_plane: Cluster, world: tuple[str, Api], tmp_path: Path
) -> None:
    name, admin = world
    cluster = kube_control_plane
    script, flag = failing_once_plugin(tmp_path, kubeconfig_token(cluster.kubeconfig))
    server = kubeconfig.from_file(str(cluster.kubeconfig)).server
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script)}}
    a = contender("a", proxied_kubeconfig(cluster.kubeconfig, tmp_path / "a", server, user), name)
    b = contender("b", cluster.kubeconfig, name)
    toggler = Toggler(admin, name, "client")
    sampler: Sampler | None = None
    try:
        lead_then_standby(a, b)
        sampler = Sampler(a, b)
        toggler.running.set()
        time.sleep(3)
        # Only the elector asks for tokens while nothing is written: the failure is its.
        toggler.running.clear()
        time.sleep(1)
        flag.touch()
        eventually(lambda: not flag.exists(), "the plugin failed once", timeout=20)
        failed_at = time.monotonic()
        toggler.running.set()
        time.sleep(LEASE * 2)  # a standby would have taken over a dead elector's lease
        assert a.controller.leading and not b.controller.leading
        assert a.successful_writes_after(failed_at), "a stopped writing after the failure"
        # The survivor takes over once the leader stops.
        a.stopping.set()
        eventually(lambda: b.controller.leading, "b leads", timeout=LEASE * 3)
        took_over = time.monotonic()
        eventually(lambda: b.successful_writes_after(took_over), "b writes", timeout=30)
    finally:
        toggler.stop()
        if sampler is not None:
            sampler.stop()
        a.stop()
        b.stop()
    sampler.check_no_split()
    assert not sampler.leading_moments("b") or min(sampler.leading_moments("b")) > failed_at + LEASE


def test_a_hung_api_server_does_not_split_leadership_and_the_survivor_takes_over(
    kube_control_plane: Cluster, world: tuple[str, Api], tmp_path: Path
) -> None:
    name, admin = world
    cluster = kube_control_plane
    proxy = TcpProxy(kubeconfig_server(cluster.kubeconfig))
    a = contender("a", proxied_kubeconfig(cluster.kubeconfig, tmp_path / "a", proxy.url), name)
    b = contender("b", cluster.kubeconfig, name)
    toggler = Toggler(admin, name, "client")
    sampler: Sampler | None = None
    try:
        lead_then_standby(a, b)
        sampler = Sampler(a, b)
        toggler.running.set()
        time.sleep(3)
        proxy.hang()
        hung_at = time.monotonic()
        eventually(lambda: not a.controller.leading, "a stops leading", timeout=RENEW_DEADLINE + 5)
        stopped_after = time.monotonic() - hung_at
        eventually(lambda: b.controller.leading, "b leads", timeout=LEASE * 4)
        took_over = time.monotonic()
        eventually(lambda: b.successful_writes_after(took_over), "b writes", timeout=30)
        time.sleep(2)
    finally:
        toggler.stop()
        if sampler is not None:
            sampler.stop()
        proxy.close()
        a.stop()
        b.stop()
    sampler.check_no_split()
    assert stopped_after <= RENEW_DEADLINE + 5
    # Nothing of a's landed once b led: its writes since the hang all failed or ended before.
    first_b = min(sampler.leading_moments("b"))
    late = [w for w in a.api.writes if w.ok and w.ended >= first_b]
    assert not late, f"a's writes succeeded after b began to lead: {late}"
