"""Random sequences of cluster changes for NetworkPolicy, and what they leave behind.

A sequence is a list of steps (plain JSON, so a failing one prints as a runnable
reproduction); each step creates, updates or deletes one object:

    {"op": "namespace", "ns": "w", "labels": {"ns": "y"}}        create or relabel
    {"op": "delete-namespace", "ns": "w"}                        with its pods
    {"op": "pod", "ns": "x", "pod": "d", "labels": {...}, "ports": "swapped"}
                                                                 create or relabel
    {"op": "delete-pod", "ns": "x", "pod": "d"}
    {"op": "policy", "ns": "x", "name": "p0", "spec": {...}}     create or update
    {"op": "delete-policy", "ns": "x", "name": "p0"}

Every step is valid in any state (a relabel of a missing pod creates it, a delete
of a missing object does nothing), so any subsequence of a sequence is a sequence:
that is what shrinking needs. Namespace names in steps are logical (x, y, ...);
a runner maps them to real names (``World.real``). An ipBlock in a policy names
pods instead of addresses (``{"cidrOf": "x/a", "prefix": 30, "exceptOf": ["x/b"]}``),
resolved against the addresses pods have when the step runs.

``World`` follows the steps as the API server would hold the objects; its
``oracle_state()`` is what ``netpol_oracle`` judges.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.harness.netpol_oracle import ClusterState, ContainerPortSpec, OraclePod

Step = dict[str, Any]
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
SERVED = ((80, "tcp"), (81, "tcp"), (80, "udp"), (81, "udp"))
BASE_NAMESPACES = ("x", "y", "z")
BASE_PODS = ("a", "b")
EXTRA_NAMESPACES = ("w", "v")
EXTRA_PODS = ("c", "d")
POLICY_NAMES = ("p0", "p1", "p2")
APPS = ("web", "db")
ENVS = ("prod", "dev")


def port_specs(flavour: str) -> tuple[ContainerPortSpec, ...]:
    """A pod's container ports: every served (port, protocol), named
    ``serve-<port>-<protocol>`` ("std"), or with the TCP names of 80 and 81 swapped
    ("swapped"), so that a named port means different numbers on different pods."""
    specs = []
    for port, protocol in SERVED:
        named = port
        if flavour == "swapped" and protocol == "tcp":
            named = 161 - port  # 80 <-> 81
        specs.append(ContainerPortSpec(f"serve-{named}-{protocol}", port, protocol.upper()))
    return tuple(specs)


def base_steps() -> list[Step]:
    """Namespaces x, y, z labelled ns=<name>, pods a and b in each labelled pod=<name>."""
    steps: list[Step] = []
    for ns in BASE_NAMESPACES:
        steps.append({"op": "namespace", "ns": ns, "labels": {"ns": ns}})
        for pod in BASE_PODS:
            steps.append(
                {"op": "pod", "ns": ns, "pod": pod, "labels": {"pod": pod}, "ports": "std"}
            )
    return steps


@dataclass
class WorldPod:
    labels: dict[str, str]
    ports: str  # flavour, fixed at creation
    ip: str = ""


@dataclass
class World:
    """The objects as the steps leave them (logical namespace names)."""

    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[tuple[str, str], WorldPod] = field(default_factory=dict)
    # resolved, with ``policyTypes`` as the API server stores it
    policies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    real: Callable[[str], str] = lambda ns: ns
    # policies whose stored ``policyTypes`` the API server defaulted: no field manager owns
    # it, so a later apply that omits ``policyTypes`` keeps it (server-side apply removes
    # only what the applier owned), even when the new rules would default otherwise
    defaulted_types: set[tuple[str, str]] = field(default_factory=set)

    def copy(self) -> World:
        return World(
            copy.deepcopy(self.namespaces),
            {k: WorldPod(dict(p.labels), p.ports, p.ip) for k, p in self.pods.items()},
            copy.deepcopy(self.policies),
            self.real,
            set(self.defaulted_types),
        )

    # -- what a step does --------------------------------------------------------------------

    def effects(self, step: Step) -> list[Step]:
        """The step as explicit object writes, in order, given the current state: a pod
        in a missing namespace creates the namespace first; a namespace's deletion is
        its pods' too."""
        op = step["op"]
        if op == "pod" and step["ns"] not in self.namespaces:
            return [{"op": "namespace", "ns": step["ns"], "labels": {"ns": step["ns"]}}, step]
        if op == "delete-namespace" and step["ns"] not in self.namespaces:
            return []
        if op == "delete-pod" and (step["ns"], step["pod"]) not in self.pods:
            return []
        if op == "delete-policy" and (step["ns"], step["name"]) not in self.policies:
            return []
        if op == "policy" and step["ns"] not in self.namespaces:
            return [{"op": "namespace", "ns": step["ns"], "labels": {"ns": step["ns"]}}, step]
        return [step]

    def apply(self, step: Step, ips: dict[tuple[str, str], str] | None = None) -> None:
        """Record one explicit write (from ``effects``). ``ips``: addresses of new pods."""
        op = step["op"]
        if op == "namespace":
            self.namespaces[step["ns"]] = dict(step["labels"])
        elif op == "delete-namespace":
            self.namespaces.pop(step["ns"], None)
            for key in [k for k in self.pods if k[0] == step["ns"]]:
                del self.pods[key]
            for key in [k for k in self.policies if k[0] == step["ns"]]:
                del self.policies[key]
                self.defaulted_types.discard(key)
        elif op == "pod":
            key = (step["ns"], step["pod"])
            if key in self.pods:
                self.pods[key].labels = dict(step["labels"])
            else:
                ip = (ips or {}).get(key, "")
                self.pods[key] = WorldPod(dict(step["labels"]), step.get("ports", "std"), ip)
        elif op == "delete-pod":
            self.pods.pop((step["ns"], step["pod"]), None)
        elif op == "policy":
            self._store_policy((step["ns"], step["name"]), self.resolve_spec(step["spec"]))
        elif op == "delete-policy":
            self.policies.pop((step["ns"], step["name"]), None)
            self.defaulted_types.discard((step["ns"], step["name"]))
        else:
            raise ValueError(f"unknown step {step!r}")

    def _store_policy(self, key: tuple[str, str], spec: dict[str, Any]) -> None:
        """The spec as the API server stores it after a server-side apply of ``spec``."""
        if "policyTypes" in spec:
            self.defaulted_types.discard(key)
        else:
            stored = self.policies.get(key)
            if stored is not None and key in self.defaulted_types:
                spec["policyTypes"] = list(stored["policyTypes"])
            else:
                spec["policyTypes"] = ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]
            self.defaulted_types.add(key)
        self.policies[key] = spec

    # -- names and addresses -----------------------------------------------------------------

    def resolve_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The spec as the API server gets it: pod-named ipBlocks become CIDRs (of the
        pods' addresses now; a pod without one lends a documentation address),
        logical namespace names in kubernetes.io/metadata.name selectors become real."""

        def address(ref: str) -> ipaddress.IPv4Address:
            ns, name = ref.split("/")
            pod = self.pods.get((ns, name))
            return ipaddress.IPv4Address(pod.ip if pod and pod.ip else "192.0.2.1")

        def walk(value: Any) -> Any:
            if isinstance(value, dict):
                if "cidrOf" in value:
                    net = ipaddress.IPv4Network(
                        f"{address(value['cidrOf'])}/{value['prefix']}", strict=False
                    )
                    block: dict[str, Any] = {"cidr": str(net)}
                    excepts = [
                        str(ipaddress.IPv4Network(f"{address(r)}/32"))
                        for r in value.get("exceptOf", ())
                    ]
                    excepts = [
                        e
                        for e in dict.fromkeys(excepts)
                        if ipaddress.IPv4Network(e).subnet_of(net) and e != str(net)
                    ]
                    if excepts:
                        block["except"] = excepts
                    return block
                out = {k: walk(v) for k, v in value.items()}
                if out.get("key") == NAMESPACE_NAME_LABEL and "values" in out:
                    out["values"] = [self.real(v) for v in out["values"]]
                if "matchLabels" in out and NAMESPACE_NAME_LABEL in out["matchLabels"]:
                    labels = dict(out["matchLabels"])
                    labels[NAMESPACE_NAME_LABEL] = self.real(labels[NAMESPACE_NAME_LABEL])
                    out["matchLabels"] = labels
                return out
            if isinstance(value, list):
                return [walk(v) for v in value]
            return value

        return walk(copy.deepcopy(spec))

    def oracle_state(self) -> ClusterState:
        state = ClusterState()
        for ns, labels in self.namespaces.items():
            state.namespaces[self.real(ns)] = {**labels, NAMESPACE_NAME_LABEL: self.real(ns)}
        for (ns, name), pod in self.pods.items():
            real = self.real(ns)
            state.pods[(real, name)] = OraclePod(
                real, name, pod.labels, pod.ip, port_specs(pod.ports)
            )
        for (ns, name), spec in self.policies.items():
            state.policies[(self.real(ns), name)] = spec
        return state


# -- the generator ---------------------------------------------------------------------------


class Generator:
    """Random steps over a small vocabulary, so that selectors often match something."""

    def __init__(self, rng: random.Random, max_pods: int = 9, max_policies: int = 3) -> None:
        self.rng = rng
        self.max_pods = max_pods
        self.max_policies = max_policies

    # labels and selectors: mostly values that some pod or namespace has now, so that
    # most policies select something and most changes move a verdict

    def pod_labels(self, name: str) -> dict[str, str]:
        labels = {
            "pod": name if self.rng.random() < 0.85 else self.rng.choice(BASE_PODS + EXTRA_PODS)
        }
        if self.rng.random() < 0.45:
            labels["app"] = self.rng.choice(APPS)
        if self.rng.random() < 0.35:
            labels["new-label"] = "abc"
        return labels

    def namespace_labels(self, name: str, world: World) -> dict[str, str]:
        if self.rng.random() < 0.3 and world.namespaces:
            # a namespace with another's labels (a "y-2" of "y")
            twin = self.rng.choice(sorted(world.namespaces))
            return dict(world.namespaces[twin])
        labels = {"ns": name if self.rng.random() < 0.85 else self.rng.choice(BASE_NAMESPACES)}
        if self.rng.random() < 0.5:
            labels["env"] = self.rng.choice(ENVS)
        return labels

    def _expression(self, keys: dict[str, tuple[str, ...]]) -> dict[str, Any]:
        key = self.rng.choice(sorted(keys))
        operator = self.rng.choice(("In", "In", "NotIn", "Exists", "DoesNotExist"))
        expression: dict[str, Any] = {"key": key, "operator": operator}
        if operator in ("In", "NotIn"):
            count = self.rng.randint(1, min(2, len(keys[key])))
            expression["values"] = sorted(self.rng.sample(keys[key], count))
        return expression

    def _selector(
        self, present: list[tuple[str, str]], keys: dict[str, tuple[str, ...]]
    ) -> dict[str, Any]:
        roll = self.rng.random()
        if roll < 0.15:
            return {}
        if roll < 0.6 and present:
            key, value = self.rng.choice(present)
            return {"matchLabels": {key: value}}
        selector: dict[str, Any] = {}
        if roll < 0.8:
            key = self.rng.choice(sorted(keys))
            selector["matchLabels"] = {key: self.rng.choice(keys[key])}
        if roll >= 0.7:
            selector["matchExpressions"] = [self._expression(keys)]
        return selector

    def pod_selector(self, world: World | None = None) -> dict[str, Any]:
        present = sorted(
            {kv for pod in (world.pods.values() if world else ()) for kv in pod.labels.items()}
        )
        return self._selector(
            present, {"pod": BASE_PODS + EXTRA_PODS, "app": APPS, "new-label": ("abc",)}
        )

    def namespace_selector(self, world: World | None = None) -> dict[str, Any]:
        names = BASE_NAMESPACES + EXTRA_NAMESPACES
        if self.rng.random() < 0.12:
            return {"matchLabels": {NAMESPACE_NAME_LABEL: self.rng.choice(names)}}
        present = sorted(
            {kv for labels in (world.namespaces.values() if world else ()) for kv in labels.items()}
        )
        return self._selector(present, {"ns": names, "env": ENVS})

    # rules

    def peer(self, world: World) -> dict[str, Any]:
        roll = self.rng.random()
        if roll < 0.35:
            return {"podSelector": self.pod_selector()}
        if roll < 0.6:
            return {"namespaceSelector": self.namespace_selector()}
        if roll < 0.8:
            return {
                "podSelector": self.pod_selector(),
                "namespaceSelector": self.namespace_selector(),
            }
        pods = [f"{ns}/{name}" for ns, name in sorted(world.pods)] or ["x/a"]
        block: dict[str, Any] = {
            "cidrOf": self.rng.choice(pods),
            "prefix": self.rng.choice((32, 30, 28, 24, 16)),
        }
        if self.rng.random() < 0.5:
            block["exceptOf"] = self.rng.sample(pods, min(len(pods), self.rng.randint(1, 2)))
        return {"ipBlock": block}

    def port(self) -> dict[str, Any]:
        roll = self.rng.random()
        protocol = self.rng.choice(("TCP", "UDP", None))
        port: dict[str, Any] = {}
        if roll < 0.45:
            port["port"] = self.rng.choice((80, 81, 53))
            if self.rng.random() < 0.2:
                port["port"] = 80
                port["endPort"] = self.rng.choice((80, 81, 90))
        elif roll < 0.8:
            named_protocol = (protocol or "TCP").lower()
            port["port"] = f"serve-{self.rng.choice((80, 81))}-{named_protocol}"
        # else: no port number, every port of the protocol
        if protocol is not None:
            port["protocol"] = protocol
        return port

    def rule(self, world: World, peers_field: str) -> dict[str, Any]:
        rule: dict[str, Any] = {}
        roll = self.rng.random()
        if roll < 0.08:
            rule[peers_field] = []
        elif roll < 0.92:
            rule[peers_field] = [self.peer(world) for _ in range(self.rng.randint(1, 2))]
        roll = self.rng.random()
        if roll < 0.05:
            rule["ports"] = []
        elif roll < 0.85:
            rule["ports"] = [self.port() for _ in range(self.rng.randint(1, 2))]
        return rule

    def policy_spec(self, world: World) -> dict[str, Any]:
        spec: dict[str, Any] = {"podSelector": self.pod_selector(world)}
        types = self.rng.choice(
            (None, ["Ingress"], ["Egress"], ["Ingress", "Egress"], ["Ingress", "Egress"])
        )
        if types is not None:
            spec["policyTypes"] = types
        for field_name, peers_field in (("ingress", "from"), ("egress", "to")):
            roll = self.rng.random()
            if roll < 0.25:
                continue  # absent
            count = 0 if roll < 0.45 else (1 if roll < 0.8 else 2)
            spec[field_name] = [self.rule(world, peers_field) for _ in range(count)]
        if (
            types is None
            and not spec.get("egress")
            and "ingress" not in spec
            and self.rng.random() < 0.5
        ):
            spec["egress"] = [self.rule(world, "to")]
        return spec

    # steps

    def policy_step(self, world: World) -> Step:
        populated = sorted({ns for ns, _ in world.pods}) or sorted(world.namespaces) or ["x"]
        if len(world.policies) >= self.max_policies and self.rng.random() < 0.7:
            ns, name = self.rng.choice(sorted(world.policies))
        else:
            ns, name = self.rng.choice(populated), self.rng.choice(POLICY_NAMES)
        return {"op": "policy", "ns": ns, "name": name, "spec": self.policy_spec(world)}

    def step(self, world: World, roll: float | None = None) -> Step:
        """A random step; ``roll`` picks its kind (the same roll, the same kind)."""
        rng = self.rng
        namespaces = sorted(world.namespaces) or list(BASE_NAMESPACES)
        roll = rng.random() if roll is None else roll
        if roll < 0.3:
            return self.policy_step(world)
        if roll < 0.36 and world.policies:
            ns, name = rng.choice(sorted(world.policies))
            return {"op": "delete-policy", "ns": ns, "name": name}
        if roll < 0.56:
            if world.pods and (len(world.pods) >= self.max_pods or rng.random() < 0.6):
                ns, name = rng.choice(sorted(world.pods))
                return {
                    "op": "pod", "ns": ns, "pod": name,
                    "labels": self.relabelled(world.pods[(ns, name)].labels, world, "pod"),
                    "ports": world.pods[(ns, name)].ports,
                }  # fmt: skip
            else:
                ns, name = rng.choice(namespaces), rng.choice(BASE_PODS + EXTRA_PODS)
            return {
                "op": "pod", "ns": ns, "pod": name, "labels": self.pod_labels(name),
                "ports": rng.choice(("std", "std", "swapped")),
            }  # fmt: skip
        if roll < 0.68 and len(world.pods) > 3:
            ns, name = rng.choice(sorted(world.pods))
            return {"op": "delete-pod", "ns": ns, "pod": name}
        if roll < 0.82:
            ns = rng.choice(sorted(set(namespaces) | set(EXTRA_NAMESPACES)))
            if ns in world.namespaces and rng.random() < 0.7:
                labels = self.relabelled(world.namespaces[ns], world, "namespace")
            else:
                labels = self.namespace_labels(ns, world)
            return {"op": "namespace", "ns": ns, "labels": labels}
        if roll < 0.9:
            # a new namespace with pods in one step is two steps: the pod creates it
            ns = rng.choice(EXTRA_NAMESPACES)
            name = rng.choice(BASE_PODS)
            return {
                "op": "pod",
                "ns": ns,
                "pod": name,
                "labels": self.pod_labels(name),
                "ports": "std",
            }
        candidates = [ns for ns in namespaces if sum(1 for k in world.pods if k[0] != ns) >= 3]
        if candidates:
            return {"op": "delete-namespace", "ns": rng.choice(candidates)}
        return {
            "op": "policy",
            "ns": rng.choice(namespaces),
            "name": rng.choice(POLICY_NAMES),
            "spec": self.policy_spec(world),
        }

    def relabelled(self, labels: dict[str, str], world: World, kind: str) -> dict[str, str]:
        """``labels`` with one label that some policy's selector reads now toggled (added,
        changed or removed), so that the change moves what the selector picks."""
        read = sorted(_selector_labels(world.policies.values(), kind))
        if not read or self.rng.random() < 0.2:
            fresh = self.pod_labels(labels.get("pod", "a")) if kind == "pod" else None
            return fresh if fresh is not None else {**labels, "env": self.rng.choice(ENVS)}
        key, value = self.rng.choice(read)
        out = dict(labels)
        if out.get(key) == value:
            if key in ("pod", "ns") or self.rng.random() < 0.5:
                out[key] = (
                    value + "-2"
                    if key not in ("pod", "ns")
                    else self.rng.choice(
                        (BASE_PODS + EXTRA_PODS) if kind == "pod" else BASE_NAMESPACES
                    )
                )
            else:
                del out[key]
        else:
            out[key] = value
        return out

    def sequence(self, world: World, length: int, tries: int = 4) -> list[Step]:
        """``length`` steps from ``world`` (which is left as it was). Each step is of a
        random kind, the first of up to ``tries`` candidates of that kind that moves a
        verdict between pods that exist before and after it, so that few steps are
        spent on changes nothing reads."""
        scratch = world.copy()
        steps: list[Step] = []
        for number in range(length):
            before = scratch.oracle_state().table(SERVED)
            roll = self.rng.random()
            for _ in range(tries):
                # Changes under a policy are the interesting ones: start with one.
                if number == 0 and not scratch.policies:
                    step = self.policy_step(scratch)
                else:
                    step = self.step(scratch, roll)
                after_world = scratch.copy()
                _apply(after_world, step, f"198.51.100.{number + 1}")
                after = after_world.oracle_state().table(SERVED)
                if any(after.get(k, v) != v for k, v in before.items()):
                    break
            steps.append(step)
            scratch = after_world
        return steps


def _apply(world: World, step: Step, new_ip: str) -> None:
    for effect in world.effects(step):
        new_pod = effect["op"] == "pod" and (effect["ns"], effect["pod"]) not in world.pods
        world.apply(effect, {(effect["ns"], effect["pod"]): new_ip} if new_pod else None)


def _selector_labels(specs: Iterable[dict[str, Any]], kind: str) -> set[tuple[str, str]]:
    """(key, value) pairs that the policies' pod (kind "pod") or namespace selectors read."""
    found: set[tuple[str, str]] = set()

    def selector(value: dict[str, Any] | None) -> None:
        if not value:
            return
        found.update(
            (k, v) for k, v in (value.get("matchLabels") or {}).items() if k != NAMESPACE_NAME_LABEL
        )
        for expression in value.get("matchExpressions") or ():
            for v in expression.get("values") or ("abc",):
                if expression["key"] != NAMESPACE_NAME_LABEL:
                    found.add((expression["key"], v))

    for spec in specs:
        if kind == "pod":
            selector(spec.get("podSelector"))
        for rules, peers in (("ingress", "from"), ("egress", "to")):
            for rule in spec.get(rules) or ():
                for peer in rule.get(peers) or ():
                    selector(peer.get("podSelector" if kind == "pod" else "namespaceSelector"))
    return found


# -- shrinking ---------------------------------------------------------------------------------


def shrink(steps: list[Step], fails: Callable[[list[Step]], bool], budget: int = 40) -> list[Step]:
    """A shorter sequence that still fails (delta debugging: drop chunks, then single
    steps), trying at most ``budget`` candidates; ``fails`` runs one candidate."""
    current = list(steps)
    tries = 0
    chunk = max(1, len(current) // 2)
    while chunk >= 1 and tries < budget:
        start = 0
        progressed = False
        while start < len(current) and tries < budget:
            candidate = current[:start] + current[start + chunk :]
            if not candidate:
                start += chunk
                continue
            tries += 1
            if fails(candidate):
                current = candidate
                progressed = True
            else:
                start += chunk
        if not progressed:
            chunk //= 2
    return current


def reproduction(steps: Iterable[Step], seed: int | None = None) -> str:
    """A command that replays ``steps`` (the base state first) on a test cluster."""
    where = f" (seed {seed})" if seed is not None else ""
    payload = json.dumps(list(steps), separators=(",", ":"))
    return f"# replay{where}:\npython -m tests.harness.policy_fuzz replay '{payload}'"
