"""Random sequences of cluster changes played on a real cluster and model-checked.

Each step (``tests.harness.policy_sequences``) is carried out with kubectl; then
every ordered pair of distinct pods is probed on every served port (TCP and UDP on
80 and 81), through the pod's address and through its Service's ClusterIP (so
kube-proxy's DNAT is on the path), and what arrived, counted at the receiving
pod, is compared with ``tests.harness.netpol_oracle``:

- the probes may show the old verdict for a while (the agent has not seen the
  change yet), never one that neither the old nor the new state allows (a window);
- within ``settle`` seconds they must show exactly the new verdicts;
- then ``sluicectl datapath verify`` must find the live maps equal to a
  computation from scratch.

A failing sequence is shrunk (steps dropped while it still fails) and printed as
a command that replays it:

    python -m tests.harness.policy_fuzz run --seconds 600 [--resolver controller] [--seed N]
    python -m tests.harness.policy_fuzz replay '<steps as JSON>' [--resolver controller]

Both bring a single-node cluster up (cluster ``fuzz``) and down again.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.harness.cache import AGNHOST_IMAGE
from tests.harness.cluster import Cluster
from tests.harness.kube_matrix import MATRIX_PROBE, PYTHON, KubePod
from tests.harness.netpol_oracle import ClusterState, OraclePod
from tests.harness.policy_sequences import (
    SERVED,
    Generator,
    Step,
    World,
    base_steps,
    reproduction,
    shrink,
)
from tests.harness.sequence_objects import container_ports, namespace_document
from tests.harness.waiting import eventually

PodKey = tuple[str, str]  # (logical namespace, name)
Probe = tuple[tuple[str, str], tuple[str, str], int, str]  # real (ns, pod) pairs, port, proto
FIELD_MANAGER = "policy-sequences"
# Each pod's own Service selects it by this label, which no step sets or selects on.
SERVICE_LABEL = "sequences.sluice.dev/pod"


@dataclass
class Failure:
    step_number: int
    step: Step
    problem: str

    def __str__(self) -> str:
        return f"after step {self.step_number} {json.dumps(self.step)}: {self.problem}"


@dataclass
class Tally:
    sequences: int = 0
    steps: int = 0
    probes: int = 0
    failures: list[str] = field(default_factory=list)


def mark_new_pods_external(old: ClusterState, new: ClusterState) -> ClusterState:
    """The old state, with every pod only the new state has as an address no selector
    picks (what the agent knew of it before it learnt of the pod)."""
    widened = old.copy()
    for ref, pod in new.pods.items():
        if ref not in widened.pods:
            widened.pods[ref] = OraclePod(pod.namespace, pod.name, {}, pod.ip, pod.ports, True)
    return widened


class SequenceRunner:
    """Plays sequences on ``cluster`` (its agent enforcing, in either resolver mode)."""

    def __init__(
        self,
        cluster: Cluster,
        settle: float = 20.0,
        probe_timeout: float = 1.0,
        verify: bool = True,
        log: Any = print,
        verbose: bool = False,
    ) -> None:
        self.cluster = cluster
        self.settle = settle
        self.probe_timeout = probe_timeout
        self.check_verify = verify
        self.log = log
        self.verbose = verbose
        self.suffix = uuid.uuid4().hex[:5]
        self.world = World(real=self.real)
        self.pods: dict[PodKey, KubePod] = {}
        self.tally = Tally()

    def real(self, ns: str) -> str:
        return f"{ns}-{self.suffix}"

    # -- carrying steps out -----------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120.0) -> str:
        return self.cluster.kubectl(*args, stdin=stdin, timeout=timeout).stdout

    def do(self, effect: Step) -> None:
        """One explicit write (``World.effects``), for real, then in the world."""
        op = effect["op"]
        if op == "namespace":
            self._namespace(effect)
            self.world.apply(effect)
        elif op == "delete-namespace":
            ns = effect["ns"]
            for key in [k for k in self.pods if k[0] == ns]:
                self.pods.pop(key).stop_serving()
            self.kubectl("delete", "namespace", self.real(ns), "--wait=true", timeout=180)
            self.world.apply(effect)
        elif op == "pod":
            key = (effect["ns"], effect["pod"])
            if key in self.world.pods:
                self._relabel(
                    "pod", self.real(key[0]), key[1], self.world.pods[key].labels, effect["labels"]
                )
                self.world.apply(effect)
            else:
                ip = self._create_pod(key, effect["labels"], effect.get("ports", "std"))
                self.world.apply(effect, {key: ip})
        elif op == "delete-pod":
            key = (effect["ns"], effect["pod"])
            pod = self.pods.pop(key)
            pod.stop_serving()
            self.kubectl(
                "delete", "-n", pod.namespace, f"pod/{pod.name}", f"service/s-{pod.name}",
                "--ignore-not-found", "--wait=true",
            )  # fmt: skip
            self.world.apply(effect)
        elif op == "policy":
            key = (effect["ns"], effect["name"])
            document = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": key[1], "namespace": self.real(key[0])},
                # pod-named ipBlocks resolved with today's addresses, as the world does
                "spec": self.world.resolve_spec(effect["spec"]),
            }
            self.world.apply(effect)
            stored = json.loads(self.kubectl(
                "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                "-o", "json", "-f", "-", stdin=json.dumps(document),
            ))["spec"]  # fmt: skip
            # the oracle judges the stored object: its model of what the server keeps
            # (defaulted policyTypes survive a later apply) must hold
            expected = self.world.policies[key]["policyTypes"]
            if stored.get("policyTypes") != expected:
                raise AssertionError(
                    f"the API server stored policyTypes {stored.get('policyTypes')} for {key}, "
                    f"the world model says {expected}"
                )
        elif op == "delete-policy":
            self.kubectl(
                "delete", "networkpolicy", "-n", self.real(effect["ns"]), effect["name"],
                "--ignore-not-found",
            )  # fmt: skip
            self.world.apply(effect)
        else:
            raise ValueError(f"unknown step {effect!r}")

    def _namespace(self, effect: Step) -> None:
        ns = effect["ns"]
        if ns in self.world.namespaces:
            self._relabel(
                "namespace", "", self.real(ns), self.world.namespaces[ns], effect["labels"]
            )
            return
        probe = World(real=self.real)
        probe.namespaces[ns] = dict(effect["labels"])
        self.kubectl("create", "-f", "-", stdin=json.dumps(namespace_document(probe, ns)))
        # Pods are refused until the namespace's default ServiceAccount exists.
        eventually(
            lambda: (
                self.cluster.kubectl(
                    "get", "serviceaccount", "-n", self.real(ns), "default", check=False
                ).returncode
                == 0
            ),
            f"the default ServiceAccount of {self.real(ns)}",
            60,
        )

    def _relabel(
        self, kind: str, namespace: str, name: str, old: dict[str, str], new: dict[str, str]
    ) -> None:
        changes = [f"{k}={v}" for k, v in new.items() if old.get(k) != v]
        changes += [f"{k}-" for k in old if k not in new]
        if not changes:
            return
        where = ["-n", namespace] if namespace else []
        self.kubectl("label", kind, *where, name, "--overwrite", *changes)

    def _create_pod(self, key: PodKey, labels: dict[str, str], flavour: str) -> str:
        namespace, name = self.real(key[0]), key[1]
        pod_manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "c",
                        "image": AGNHOST_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["pause"],
                        "ports": container_ports(flavour),
                    }
                ],
            },
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"s-{name}", "namespace": namespace},
            # The pod's own Service, selecting it by a label no step changes.
            "spec": {
                "selector": {SERVICE_LABEL: name},
                "ports": [
                    {
                        "name": f"p{port}-{proto}",
                        "port": port,
                        "targetPort": port,
                        "protocol": proto.upper(),
                    }
                    for port, proto in SERVED
                ],
            },
        }
        pod_manifest["metadata"]["labels"] = {**labels, SERVICE_LABEL: name}
        manifest = {"apiVersion": "v1", "kind": "List", "items": [pod_manifest, service]}
        self.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
        self.kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", "--timeout=120s", f"pod/{name}",
            timeout=130,
        )  # fmt: skip
        found = self.cluster.kubectl_json("get", "pod", "-n", namespace, name)
        service_found = self.cluster.kubectl_json("get", "service", "-n", namespace, f"s-{name}")
        pod = KubePod(namespace, key[0], name)
        pod.ip = found["status"]["podIP"]
        pod.cluster_ip = service_found["spec"]["clusterIP"]
        pod.netns = self._netns(namespace, name)
        pod.serve()
        self.pods[key] = pod
        return pod.ip

    def _netns(self, namespace: str, name: str) -> str:
        containerd = self.cluster.containerd
        ids = containerd.crictl(
            "pods", "--namespace", namespace, "--name", name, "--state", "ready", "-q"
        ).stdout.split()
        assert len(ids) == 1, f"{namespace}/{name}: sandboxes {ids}"
        info = containerd.crictl_json("inspectp", ids[0])
        return f"/proc/{info['info']['pid']}/ns/net"

    # -- probing ------------------------------------------------------------------------------

    def _endpoints_forwarded(self) -> None:
        """Until kube-proxy forwards every pod's ClusterIP to it (probed from the node)."""
        for pod in self.pods.values():
            targets = json.dumps([[pod.cluster_ip, 80, "tcp"]])

            def forwarded(targets: str = targets) -> bool:
                proc = subprocess.run(
                    [PYTHON, MATRIX_PROBE, targets, "1"],
                    capture_output=True, text=True, timeout=30, check=False,
                )  # fmt: skip
                return proc.stdout.strip() == "[true]"

            eventually(forwarded, f"kube-proxy forwarding {pod.cluster_ip} to {pod.key}", 60)

    def observe(
        self, via_cluster_ip: bool, probes: Iterable[Probe] | None = None
    ) -> dict[Probe, bool]:
        """Who reached whom, counted at the receiving pods."""
        by_real = {(pod.namespace, pod.name): pod for pod in self.pods.values()}
        wanted = sorted(probes) if probes is not None else [
            (s, d, port, proto)
            for s in sorted(by_real) for d in sorted(by_real) if s != d
            for port, proto in SERVED
        ]  # fmt: skip
        per_source: dict[tuple[str, str], list[Probe]] = {}
        for probe in wanted:
            per_source.setdefault(probe[0], []).append(probe)
        before = {ref: pod.received() for ref, pod in by_real.items()}

        def run(source: tuple[str, str]) -> None:
            targets = [
                [by_real[d].cluster_ip if via_cluster_ip else by_real[d].ip, port, proto]
                for _, d, port, proto in per_source[source]
            ]
            by_real[source].reaches(targets, self.probe_timeout)

        with ThreadPoolExecutor(max_workers=max(1, len(per_source))) as pool:
            list(pool.map(run, per_source))
        after = {ref: pod.received() for ref, pod in by_real.items()}
        self.tally.probes += len(wanted)
        reached = {}
        for source, destination, port, proto in wanted:
            key = (proto, port, by_real[source].ip)
            reached[(source, destination, port, proto)] = after[destination].get(key, 0) > before[
                destination
            ].get(key, 0)
        return reached

    # -- one step, checked --------------------------------------------------------------------

    def check(self, old: ClusterState, new: ClusterState) -> str | None:
        """Probe until the verdicts are the new state's; a window or a verdict still wrong
        after ``settle`` seconds is a problem."""
        expected = new.table(SERVED)
        union = mark_new_pods_external(old, new)
        deadline = time.monotonic() + self.settle
        for via in (False, True):
            path = "ClusterIP" if via else "pod address"
            pending: list[Probe] | None = None
            while True:
                seen = self.observe(via, pending)
                window = [
                    p for p, reached in seen.items()
                    if reached and not expected[p] and not union.allowed(p[0], p[1], p[2], p[3])
                ]  # fmt: skip
                if window:
                    return f"through the {path}: a window: " + "; ".join(
                        _name(p, new) for p in window[:4]
                    )
                wrong = [p for p, reached in seen.items() if reached != expected[p]]
                if not wrong:
                    break
                if time.monotonic() > deadline:
                    listed = "; ".join(_name(p, new, expected[p]) for p in wrong[:6])
                    late = f"{len(wrong)} verdict(s) wrong after {self.settle:.0f} s"
                    return f"through the {path}, {late}: {listed}"
                pending = wrong
                time.sleep(0.5)
        return None

    def verify(self) -> str | None:
        """``sluicectl datapath verify``: the live maps equal a computation from scratch."""
        last = ""
        for _ in range(20):
            proc = self.cluster.sluicectl(
                "datapath",
                "verify",
                "--conf",
                str(self.cluster.sluice_conf),
                "-o",
                "json",
                check=False,
            )
            if proc.returncode not in (0, 1):
                last = proc.stderr.strip()
                time.sleep(0.5)
                continue
            report = json.loads(proc.stdout)
            if report["pending"]:
                last = f"pending: {report['pending']}"
                time.sleep(0.5)
                continue
            if report["differences"]:
                return "sluicectl datapath verify: " + "; ".join(
                    f"{d['kind']} {d['subject']}: {d['detail']}" for d in report["differences"]
                )
            return None
        return f"sluicectl datapath verify never settled: {last}"

    def play(self, steps: list[Step], checked: bool = True) -> Failure | None:
        """Carry out ``steps``, checking after each; the first failure."""
        for number, step in enumerate(steps, 1):
            started = time.monotonic()
            old = self.world.oracle_state()
            for effect in self.world.effects(step):
                self.do(effect)
            self.tally.steps += 1
            if not checked:
                continue
            self._endpoints_forwarded()
            problem = self.check(old, self.world.oracle_state())
            if problem is None and self.check_verify:
                problem = self.verify()
            if self.verbose:
                took = time.monotonic() - started
                self.log(f"  step {number} ({took:.1f} s): {json.dumps(step)}")
            if problem is not None:
                return Failure(number, step, problem)
        return None

    # -- sequences ----------------------------------------------------------------------------

    def setup(self) -> None:
        """The base state: namespaces x, y, z with pods a and b."""
        self.play(base_steps(), checked=False)
        self._base = self.world.copy()

    def reset(self) -> None:
        """Back to the base state: policies gone, extra pods and namespaces gone, base
        labels back, deleted base pods created again."""
        base = self._base
        self._sweep()
        for key in list(self.world.policies):
            self.do({"op": "delete-policy", "ns": key[0], "name": key[1]})
        for ns in [ns for ns in self.world.namespaces if ns not in base.namespaces]:
            self.do({"op": "delete-namespace", "ns": ns})
        for key in [k for k in self.world.pods if k not in base.pods]:
            self.do({"op": "delete-pod", "ns": key[0], "pod": key[1]})
        for ns, labels in base.namespaces.items():
            for effect in self.world.effects({"op": "namespace", "ns": ns, "labels": labels}):
                self.do(effect)
        for key, pod in base.pods.items():
            step = {
                "op": "pod",
                "ns": key[0],
                "pod": key[1],
                "labels": pod.labels,
                "ports": pod.ports,
            }
            for effect in self.world.effects(step):
                self.do(effect)

    def _sweep(self) -> None:
        """Delete what a step that failed half-way left in the cluster but not in the
        world: a namespace created before its ServiceAccount came, a pod never Ready."""
        tail = f"-{self.suffix}"
        listed = self.cluster.kubectl_json("get", "namespaces")["items"]
        ours = {n["metadata"]["name"] for n in listed if n["metadata"]["name"].endswith(tail)}
        for real in sorted(ours - {self.real(ns) for ns in self.world.namespaces}):
            self.kubectl("delete", "namespace", real, "--wait=true", timeout=180)
        known = {(pod.namespace, pod.name) for pod in self.pods.values()}
        for ns in self.world.namespaces:
            real = self.real(ns)
            for item in self.cluster.kubectl_json("get", "pods", "-n", real)["items"]:
                name = item["metadata"]["name"]
                if (real, name) not in known:
                    self.kubectl(
                        "delete", "-n", real, f"pod/{name}", f"service/s-{name}",
                        "--ignore-not-found", "--wait=true",
                    )  # fmt: skip

    def run_sequence(
        self, steps: list[Step], seed: int | None = None, shrink_budget: int = 12
    ) -> str | None:
        """Play one sequence from the base state; on failure, shrink it and return the
        report with its reproduction."""
        self.reset()
        self.tally.sequences += 1
        failure = self.play(steps)
        if failure is None:
            return None
        self.log(f"FAILED (seed {seed}): {failure}; shrinking")

        def fails(candidate: list[Step]) -> bool:
            self.reset()
            return self.play(candidate) is not None

        minimal = shrink(steps, fails, shrink_budget)
        self.reset()
        final = self.play(minimal) or failure
        report = f"{final}\n{reproduction(minimal, seed)}"
        self.tally.failures.append(report)
        return report

    def destroy(self) -> None:
        for pod in self.pods.values():
            pod.stop_serving()
        for ns in list(self.world.namespaces):
            self.kubectl(
                "delete",
                "namespace",
                self.real(ns),
                "--ignore-not-found",
                "--wait=true",
                timeout=180,
            )
        self.pods.clear()


def _name(probe: Probe, state: ClusterState, expected: bool | None = None) -> str:
    source, destination, port, proto = probe
    verdict = "" if expected is None else f" (should be {'allowed' if expected else 'denied'})"
    return f"{source[0]}/{source[1]} -> {destination[0]}/{destination[1]} {proto}/{port}{verdict}"


def random_sequences(
    runner: SequenceRunner, seed: int, sequences: int, length: int, deadline: float | None = None
) -> list[str]:
    """``sequences`` random sequences of ``length`` steps from ``seed`` (each sequence
    has its own seed, ``seed * 1000 + n``); the failures, each with its reproduction."""
    failures = []
    for n in range(sequences):
        if deadline is not None and time.monotonic() > deadline:
            break
        sequence_seed = seed * 1000 + n
        steps = Generator(random.Random(sequence_seed)).sequence(runner._base, length)
        problem = runner.run_sequence(steps, sequence_seed)
        if problem is not None:
            failures.append(problem)
    return failures


# -- the command line -----------------------------------------------------------------------------


def _cluster(resolver: str) -> Any:
    from tests.harness.cluster import sluice_agent_argv
    from tests.harness.controller import controller_mode

    cluster = Cluster("fuzz", agent_argv=sluice_agent_argv, install_args=["--policy=enforce"])
    return cluster, (controller_mode(cluster) if resolver == "controller" else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.policy_fuzz")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="random sequences until --seconds have passed")
    run.add_argument("--seconds", type=float, default=600)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--length", type=int, default=10)
    run.add_argument("-v", "--verbose", action="store_true", help="print every step")
    replay = sub.add_parser("replay", help="one sequence (JSON list of steps)")
    replay.add_argument("steps")
    for command in (run, replay):
        command.add_argument("--resolver", choices=("agent", "controller"), default="agent")
    args = parser.parse_args(argv)

    from contextlib import ExitStack

    cluster, mode = _cluster(args.resolver)
    with ExitStack() as stack:
        if cluster.is_up():
            cluster.down()
        stack.enter_context(cluster)
        if mode is not None:
            stack.enter_context(mode)
        runner = SequenceRunner(cluster, verbose=getattr(args, "verbose", True))
        stack.callback(runner.destroy)
        runner.setup()
        if args.command == "replay":
            problem = runner.run_sequence(json.loads(args.steps), shrink_budget=0)
            print(problem or "passed")
            return 1 if problem else 0
        seed = args.seed if args.seed is not None else random.randrange(1 << 20)
        print(f"seed {seed}, {args.resolver} mode, {args.seconds:.0f} s")
        deadline = time.monotonic() + args.seconds
        failures = random_sequences(runner, seed, 1 << 30, args.length, deadline)
        tally = runner.tally
        print(
            f"{tally.sequences} sequences, {tally.steps} steps, {tally.probes} probes, "
            f"{len(failures)} failed (seed {seed}, {args.resolver} mode)"
        )
        for failure in failures:
            print(failure)
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
