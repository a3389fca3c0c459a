"""Incremental equals rebuild: a running agent's datapath compared with what a
freshly started agent would compute from the same objects, and repaired.

The agent keeps every endpoint's policy up to date incrementally (its resolver's
caches, the enforcer's record of what it installed, rule sets shared by
content). ``verify`` checks all of that against a computation from scratch:

- **resolver**: the policy the agent's resolver gives each endpoint now, against
  the one a resolver rebuilt from the same objects gives (``rebuilt()``);
- **datapath**: the rule set each direction's policy id names in the pinned
  maps, read back from its inner maps (``cni.datapath.readback``), against the
  rebuilt policy compiled now (equal digests, equal maps); a direction that is
  not isolated has no policy id; the entry's flags;
- **addresses**: every address of the endpoint is its own in ``ep_by_ip``;
- **services**: the datapath's ClusterIPs are the Services' ClusterIPs.

It compares one consistent moment: under the enforcer's lock, while no install
is in flight; endpoints whose policy is queued, not installed yet, or whose
inputs are incomplete are reported pending, not different.

``Verifier`` runs it periodically in the agent (``--verify-interval``, as
Cilium's and Calico's periodic resyncs do): a difference seen twice in a row is
counted in ``sluice_policy_drift_total`` by kind and repaired (a drifted
resolver is replaced by the rebuilt one; a drifted endpoint is reinstalled, and a
pinned rule set whose maps no longer hold what its digest says is dropped from
the index first, so that the reinstall builds it anew).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from cni.agent.endpoint_installs import EndpointKey
from cni.agent.enforcer import NOT_ISOLATED, Enforcer
from cni.datapath import readback, ruleset
from cni.datapath.policy_install import endpoint_flags
from cni.datapath.policy_writer import DatapathPolicyWriter
from cni.datapath.structs import DIR_EGRESS, DIR_INGRESS, NONE
from cni.policy.errors import PolicyIncomplete
from cni.policy.resolve import service_ips
from cni.policy.vocabulary import EndpointPolicy

log = logging.getLogger("sluice.agent")

KINDS = ("resolver", "datapath", "addresses", "services")
BUSY_WAIT = 0.02  # seconds between two looks at an enforcer busy installing


@dataclass(frozen=True)
class Difference:
    kind: str  # one of KINDS
    subject: str  # the pod (namespace/name), an endpoint's ifindex, or "services"
    detail: str
    key: EndpointKey | None = None  # the endpoint, where there is one

    def __str__(self) -> str:
        return f"{self.kind:<9} {self.subject}: {self.detail}"


@dataclass
class Report:
    checked: int = 0
    pending: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "pending": self.pending,
            "differences": [
                {k: v for k, v in asdict(d).items() if k != "key"} for d in self.differences
            ],
            "seconds": round(self.seconds, 4),
        }


class Busy(Exception):
    """The enforcer kept installing for the whole wait: nothing consistent to compare."""


class _Digests:
    """Rule set digests, each distinct rule tuple compiled once per verification (equal
    policies are shared objects, so most lookups hit)."""

    def __init__(self) -> None:
        self._known: dict[tuple[Any, ...], bytes] = {}

    def __call__(self, rules: tuple[Any, ...] | None) -> bytes | None:
        if rules is None:
            return None
        found = self._known.get(rules)
        if found is None:
            found = self._known[rules] = ruleset.digest(ruleset.compile_direction(rules))
        return found


def _describe(digest: bytes | None) -> str:
    return "not isolated" if digest is None else f"rule set {digest.hex()[:12]}"


def _pinned(enforcer: Enforcer) -> DatapathPolicyWriter:
    """The enforcer's writer into the pinned maps: what is verified is read back from
    them, so an enforcer writing anywhere else has nothing to verify."""
    writer = enforcer.writer
    if not isinstance(writer, DatapathPolicyWriter):
        raise TypeError(f"verification reads pinned maps, not a {type(writer).__name__}")
    return writer


def verify(enforcer: Enforcer, wait: float = 5.0) -> tuple[Report, Any]:
    """Compare everything once; (the report, the rebuilt resolver). Raises Busy when the
    enforcer did not stop installing within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        with enforcer.lock:
            if not enforcer.installing:
                return _compare(enforcer)
        if time.monotonic() > deadline:
            raise Busy("the agent kept installing policies; try again")
        time.sleep(BUSY_WAIT)


def _compare(enforcer: Enforcer) -> tuple[Report, Any]:
    """Call with the enforcer's lock held and no install in flight."""
    started = time.perf_counter()
    report = Report()
    datapath = _pinned(enforcer).datapath
    rebuilt = enforcer.index.rebuilt()
    live = datapath.endpoints.all()
    peer_maps, rule_maps = readback.inner_map_ids(datapath)
    read: dict[int, bytes | None] = {}  # policy id -> digest of what its maps hold
    digest = _Digests()

    def held(policy_id: int) -> bytes | None:
        if policy_id not in read:
            try:
                compiled = readback.read_direction(peer_maps[policy_id], rule_maps[policy_id])
                read[policy_id] = ruleset.digest(compiled)
            except (KeyError, OSError):
                read[policy_id] = None
        return read[policy_id]

    for key, record in sorted(enforcer.endpoints.items()):
        subject = "/".join(record.pod) if record.pod else f"ifindex {record.ifindex}"
        if key in enforcer.dirty or key not in enforcer.installed:
            report.pending.append(subject)
            continue
        report.checked += 1
        try:
            current = enforcer.endpoint_policy(key)
            fresh = rebuilt.resolve(record.pod).endpoint if record.pod else NOT_ISOLATED
        except PolicyIncomplete as err:
            report.pending.append(f"{subject} ({err})")
            continue
        except KeyError:
            fresh = current  # a pod the resolver does not know: judged as the enforcer does
        found = _compare_endpoint(key, record.ifindex, subject, current, fresh, live, held, digest)
        report.differences.extend(found)
        for ip in record.ips:
            if ":" in ip:
                continue  # the datapath is IPv4 only
            owner = datapath.endpoints.owner_of(ip)
            if owner != record.ifindex:
                report.differences.append(
                    Difference(
                        "addresses",
                        subject,
                        f"{ip} belongs to ifindex {owner} in ep_by_ip, not {record.ifindex}",
                        key,
                    )
                )
    if enforcer.ready:
        wanted = service_ips(rebuilt)  # type: ignore[arg-type]
        have = datapath.network.service_ips()
        if have != wanted:
            report.differences.append(
                Difference(
                    "services",
                    "services",
                    f"missing {sorted(wanted - have)}, extra {sorted(have - wanted)}",
                )
            )
    report.seconds = time.perf_counter() - started
    return report, rebuilt


def _compare_endpoint(
    key: EndpointKey,
    ifindex: int,
    subject: str,
    current: EndpointPolicy,
    fresh: EndpointPolicy,
    live: dict[int, Any],
    held: Callable[[int], bytes | None],
    digest: _Digests,
) -> list[Difference]:
    found: list[Difference] = []
    entry = live.get(ifindex)
    if entry is None:
        return [Difference("datapath", subject, f"no endpoint entry for ifindex {ifindex}", key)]
    for name, direction in (("ingress", DIR_INGRESS), ("egress", DIR_EGRESS)):
        want = digest(getattr(fresh, name))
        have_resolved = digest(getattr(current, name))
        if have_resolved != want:
            found.append(
                Difference(
                    "resolver",
                    subject,
                    f"{name}: the agent resolves {_describe(have_resolved)}, "
                    f"a rebuilt resolver {_describe(want)}",
                    key,
                )
            )
        policy_id = entry.policy(direction)
        if want is None:
            if policy_id != NONE:
                found.append(
                    Difference(
                        "datapath",
                        subject,
                        f"{name}: policy id {policy_id} installed, but not isolated",
                        key,
                    )
                )
            continue
        if policy_id == NONE:
            found.append(
                Difference(
                    "datapath", subject, f"{name}: not isolated, wants {_describe(want)}", key
                )
            )
            continue
        have = held(policy_id)
        if have != want:
            what = "missing maps" if have is None else _describe(have)
            found.append(
                Difference(
                    "datapath",
                    subject,
                    f"{name}: policy id {policy_id} holds {what}, wants {_describe(want)}",
                    key,
                )
            )
    if entry.flags != endpoint_flags(fresh):
        found.append(
            Difference(
                "datapath",
                subject,
                f"flags {entry.flags:#x}, wants {endpoint_flags(fresh):#x}",
                key,
            )
        )
    return found


def repair(enforcer: Enforcer, report: Report, rebuilt: Any) -> None:
    """Make the drift found good: the rebuilt resolver replaces a drifted one, drifted
    endpoints are installed again (rule sets whose maps lie dropped from the index
    first), addresses registered again, the ClusterIPs written again."""
    kinds = {d.kind for d in report.differences}
    datapath = _pinned(enforcer).datapath
    with enforcer.lock:
        if "resolver" in kinds:
            enforcer.replace_index(rebuilt)
        for difference in report.differences:
            if difference.key is None or difference.key not in enforcer.endpoints:
                continue
            record = enforcer.endpoints[difference.key]
            if difference.kind == "addresses":
                with datapath.lock:
                    datapath.endpoints.add_ips(
                        record.ifindex, [ip for ip in record.ips if ":" not in ip]
                    )
            enforcer.reinstall(difference.key)
        if "datapath" in kinds:
            _unindex_lying_rule_sets(enforcer)
        if "services" in kinds:
            enforcer.rewrite_service_ips()


def _unindex_lying_rule_sets(enforcer: Enforcer) -> None:
    """Drop from the pinned index every rule set whose maps do not hold what its digest
    names (a reinstall would reuse them otherwise)."""
    writer = _pinned(enforcer)
    datapath = writer.datapath
    with datapath.lock:
        peer_maps, rule_maps = readback.inner_map_ids(datapath)
        for digest, policy_id in datapath.policies.index().items():
            try:
                compiled = readback.read_direction(peer_maps[policy_id], rule_maps[policy_id])
            except (KeyError, OSError):
                continue  # the reaper's business
            if ruleset.digest(compiled) != digest:
                log.warning(
                    "rule set %s (policy id %d) drifted: rebuilt", digest.hex()[:12], policy_id
                )
                datapath.policies.forget(digest)
                writer.registry.forget(digest)


class Verifier:
    """Verify every ``interval`` seconds; count and repair what is seen twice in a row."""

    def __init__(
        self,
        enforcer: Enforcer,
        interval: float,
        count_drift: Callable[[str, int], None] = lambda kind, n: None,
    ) -> None:
        self.enforcer = enforcer
        self.interval = interval
        self.count_drift = count_drift
        self.last: Report | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval > 0:
            self._thread = threading.Thread(target=self._loop, name="verifier", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.enforcer.ready:
                continue
            try:
                self.run_once()
            except Busy:
                log.debug("verification skipped: the agent is busy installing")
            except Exception:
                log.exception("verification failed")

    def run_once(self, confirm_after: float = 1.0) -> Report:
        """Verify; differences seen again ``confirm_after`` seconds later are repaired."""
        first, _ = verify(self.enforcer)
        self.last = first
        if not first.differences:
            return first
        time.sleep(confirm_after)
        second, rebuilt = verify(self.enforcer)
        self.last = second
        seen = {(d.kind, d.subject, d.detail) for d in first.differences}
        confirmed = [d for d in second.differences if (d.kind, d.subject, d.detail) in seen]
        if not confirmed:
            return second
        for kind in KINDS:
            count = sum(1 for d in confirmed if d.kind == kind)
            if count:
                self.count_drift(kind, count)
        for difference in confirmed:
            log.warning("drift repaired: %s", difference)
        repair(self.enforcer, Report(second.checked, second.pending, confirmed), rebuilt)
        return second
