"""The enforcer against a datapath in memory: when policies are installed, what a
failed write leaves behind, and what a restarted agent makes of a change it did
not finish.

The enforcer and its resolver are the agent's own; the datapath is
``tests.harness.fake_datapath.FakeDatapath``, which fails on demand as the
kernel's can. The pods are those of ``tests.unit.policy.cluster`` (namespaces x,
y, z with pods a, b, c, all on the agent's node); what each endpoint must hold
is what a resolver built from scratch over the same objects gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cni.agent.endpoint_installs import EndpointKey
from cni.agent.enforcer import Enforcer
from cni.agent.enforcer_views import describe_endpoints
from cni.agent.local_store import LocalStore
from cni.agent.state import AgentState, EndpointRecord
from cni.policy.manifest import load_manifest
from cni.policy.model import PodKey
from cni.policy.vocabulary import EndpointPolicy, PolicyError
from tests.harness.fake_datapath import FakeDatapath
from tests.harness.waiting import eventually
from tests.unit.policy.cluster import CLUSTER_YAML, NODE, PODS, address, cluster, policy

X_A, X_B, X_C = ("x", "a"), ("x", "b"), ("x", "c")
IN_X = (X_A, X_B, X_C)
WAIT = 10.0  # seconds for the enforcer's worker to get somewhere

ALLOW_FROM_B = policy(
    "x",
    "allow-b",
    """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]""",
)
ISOLATE_X = policy("x", "isolate", "  podSelector: {}\n  policyTypes: [Ingress]")
DNS = """
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: z}
spec: {clusterIP: 10.96.0.10, ports: [{port: 53, protocol: UDP}]}
"""


def ifindex(pod: PodKey) -> int:
    return 100 + PODS.index(pod)


def record(pod: PodKey) -> EndpointRecord:
    return EndpointRecord(f"c-{pod[0]}-{pod[1]}", "eth0", ifindex(pod), (address(pod),), *pod)


def key(pod: PodKey) -> EndpointKey:
    return record(pod).key


def expected(*manifests: str) -> dict[int, EndpointPolicy]:
    """Every endpoint's policy as a resolver built from scratch gives it."""
    index = cluster(*manifests)
    return {ifindex(pod): index.resolve(pod).endpoint for pod in PODS}


def holds(fake: FakeDatapath, wanted: dict[int, EndpointPolicy]) -> bool:
    return all(fake.current.get(i) == policy for i, policy in wanted.items())


def pending(enforcer: Enforcer) -> set[PodKey]:
    """The pods whose endpoint the enforcer does not report installed."""
    found: set[PodKey] = set()
    for entry in describe_endpoints(enforcer):
        if entry["pending"]:
            namespace, name = entry["pod"].split("/")
            found.add((namespace, name))
    return found


def converged(enforcer: Enforcer, fake: FakeDatapath, wanted: dict[int, EndpointPolicy]) -> None:
    """Wait until the datapath holds ``wanted`` and the enforcer reports it all installed."""
    eventually(
        lambda: holds(fake, wanted) and not pending(enforcer),
        f"the datapath holding {wanted}, nothing pending",
        timeout=WAIT,
        interval=0.02,
    )


def assert_nothing_reported_that_is_not_held(enforcer: Enforcer, fake: FakeDatapath) -> None:
    """What the enforcer reports installed (not pending) is what the datapath holds."""
    with enforcer.lock:
        for entry in describe_endpoints(enforcer):
            if entry["pending"]:
                continue
            endpoint = (entry["containerID"], entry["ifname"])
            assert fake.current.get(entry["ifindex"]) == enforcer.installed[endpoint], entry
            assert fake.generations.get(entry["ifindex"]) == entry["generation"], entry


@pytest.fixture
def state(tmp_path: Path) -> Iterator[AgentState]:
    opened = AgentState(str(tmp_path), "test")
    yield opened
    opened.close()


@pytest.fixture
def enforcers() -> Iterator[Callable[[FakeDatapath, AgentState], Enforcer]]:
    """Enforcers over a datapath and a state database; all stopped afterwards."""
    made: list[Enforcer] = []

    def make(fake: FakeDatapath, state: AgentState) -> Enforcer:
        made.append(Enforcer(fake, state, NODE))
        return made[-1]

    yield make
    for enforcer in made:
        enforcer.stop()


def synced(enforcer: Enforcer, *manifests: str) -> Enforcer:
    """The enforcer once its source (the cluster and ``manifests``) has synced. Its
    worker is not started: what is installed is installed by the calls a test makes."""
    enforcer.change(load_manifest("---".join((CLUSTER_YAML, *manifests))), [])
    enforcer.mark_ready()
    return enforcer


def wired(enforcer: Enforcer) -> Enforcer:
    """Every pod's endpoint up (its ADD), and what that queued installed."""
    for pod in PODS:
        enforcer.endpoint_up(record(pod), wait=1)
    enforcer.enforce_now(list(enforcer.endpoints))
    return enforcer


# -- ordering ---------------------------------------------------------------------------


def test_an_endpoint_is_reported_up_only_once_its_policy_is_installed(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = synced(enforcers(fake, state), ALLOW_FROM_B)
    wanted = expected(ALLOW_FROM_B)
    assert wanted[ifindex(X_A)].ingress is not None  # x/a is isolated: its policy matters
    for pod in PODS:
        generation = enforcer.endpoint_up(record(pod), wait=1)
        # Nothing installs but the ADD's own call (no worker): it returned after it.
        assert fake.current.get(ifindex(pod)) == wanted[ifindex(pod)], pod
        assert fake.generations[ifindex(pod)] == generation
        assert fake.installs[-1].ifindex == ifindex(pod)
    assert pending(enforcer) == set()
    assert_nothing_reported_that_is_not_held(enforcer, fake)


def test_a_policy_change_reaches_every_endpoint_it_affects_and_no_other(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = wired(synced(enforcers(fake, state)))
    enforcer.start([])
    before = len(fake.installs)

    affected = enforcer.change(load_manifest(ISOLATE_X), [])

    assert affected == {key(pod) for pod in IN_X}
    wanted = expected(ISOLATE_X)
    converged(enforcer, fake, wanted)
    assert {install.ifindex for install in fake.installs[before:]} == {ifindex(p) for p in IN_X}
    assert all(wanted[ifindex(pod)].ingress == () for pod in IN_X)  # isolated, nothing allowed
    with enforcer.lock:
        assert not enforcer.dirty
    assert_nothing_reported_that_is_not_held(enforcer, fake)


def test_service_addresses_are_written_once_the_source_has_synced(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = enforcers(fake, state)
    enforcer.change(load_manifest("---".join((CLUSTER_YAML, DNS))), [])
    assert fake.service_writes == 0  # a partial view would empty the datapath's set
    enforcer.mark_ready()
    assert fake.service_addresses == {"10.96.0.10"}


def test_a_failed_write_of_the_service_addresses_is_tried_again_at_the_next_change(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = enforcers(fake, state)
    enforcer.change(load_manifest("---".join((CLUSTER_YAML, DNS))), [])
    fake.fail_service_write_next()
    enforcer.mark_ready()  # the write fails: logged, not taken for done
    assert fake.service_addresses == frozenset()
    enforcer.change(load_manifest(ISOLATE_X), [])  # any later change
    assert fake.service_addresses == {"10.96.0.10"}


# -- a failed write -----------------------------------------------------------------------


def test_a_refused_endpoint_stays_pending_and_is_retried_while_the_others_hold(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = wired(synced(enforcers(fake, state)))
    old, new = expected(), expected(ISOLATE_X)
    fake.reject_next([ifindex(X_B)], PolicyError("rule set does not compile"))
    affected = enforcer.change(load_manifest(ISOLATE_X), [])

    with pytest.raises(PolicyError, match="does not compile"):
        enforcer.enforce_now(affected)  # sluicectl apply's wait: it is told

    assert fake.current[ifindex(X_A)] == new[ifindex(X_A)]
    assert fake.current[ifindex(X_C)] == new[ifindex(X_C)]
    assert fake.current[ifindex(X_B)] == old[ifindex(X_B)]
    with enforcer.lock:
        assert enforcer.dirty == {key(X_B)}
        assert enforcer.installed[key(X_B)] == old[ifindex(X_B)]
    assert pending(enforcer) == {X_B}
    assert_nothing_reported_that_is_not_held(enforcer, fake)

    enforcer.start([])  # the worker takes what is still queued
    converged(enforcer, fake, new)
    assert [refusal.ifindex for refusal in fake.refusals] == [ifindex(X_B)]
    assert len(fake.installs_of(ifindex(X_A))) == 2  # its ADD's, the change's: no more
    assert_nothing_reported_that_is_not_held(enforcer, fake)


def test_the_worker_installs_a_batch_around_a_refused_endpoint_and_retries_it(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = wired(synced(enforcers(fake, state)))
    enforcer.start([])
    before = len(fake.installs)
    fake.reject_next([ifindex(X_B)])

    enforcer.change(load_manifest(ISOLATE_X), [])

    converged(enforcer, fake, expected(ISOLATE_X))
    (refused,) = fake.refusals
    assert refused.ifindex == ifindex(X_B)
    after = fake.installs[before:]
    assert [i.ifindex for i in after] == [ifindex(X_A), ifindex(X_C), ifindex(X_B)]
    assert after[-1].at > refused.at  # x/b again, after the refusal; the others once
    assert_nothing_reported_that_is_not_held(enforcer, fake)


def test_a_refused_add_fails_and_its_endpoint_is_not_reported_installed(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = synced(enforcers(fake, state), ALLOW_FROM_B)
    fake.reject_next([ifindex(X_A)])

    with pytest.raises(PolicyError):
        enforcer.endpoint_up(record(X_A), wait=1)

    assert ifindex(X_A) not in fake.current
    assert pending(enforcer) == {X_A}
    with enforcer.lock:
        assert key(X_A) in enforcer.dirty
    enforcer.endpoint_up(record(X_A), wait=1)  # the runtime's next ADD
    assert fake.current[ifindex(X_A)] == expected(ALLOW_FROM_B)[ifindex(X_A)]
    assert pending(enforcer) == set()


# -- a writer that raises ---------------------------------------------------------------


def test_an_os_error_mid_batch_reports_nothing_of_the_batch_installed(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = wired(synced(enforcers(fake, state)))
    affected = enforcer.change(load_manifest(ISOLATE_X), [])
    fake.crash_next(after=1)  # x/a switched, then the kernel refuses a write

    with pytest.raises(OSError):
        enforcer.enforce_now(affected)

    new = expected(ISOLATE_X)
    assert fake.current[ifindex(X_A)] == new[ifindex(X_A)]  # written before the error
    assert fake.current[ifindex(X_B)] != new[ifindex(X_B)]
    assert pending(enforcer) == set(IN_X)  # none of the batch reported installed
    with enforcer.lock:
        assert enforcer.dirty == affected
    assert_nothing_reported_that_is_not_held(enforcer, fake)

    enforcer.start([])
    converged(enforcer, fake, new)
    assert_nothing_reported_that_is_not_held(enforcer, fake)


def test_an_os_error_fails_the_add(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()
    enforcer = synced(enforcers(fake, state))
    fake.crash_next()

    with pytest.raises(OSError):
        enforcer.endpoint_up(record(X_A), wait=1)

    assert ifindex(X_A) not in fake.current
    assert pending(enforcer) == {X_A}
    assert_nothing_reported_that_is_not_held(enforcer, fake)


# -- a restart mid-change ---------------------------------------------------------------


def test_a_restarted_agent_finishes_the_change_the_last_one_left_half_done(
    enforcers: Callable[[FakeDatapath, AgentState], Enforcer], state: AgentState
) -> None:
    fake = FakeDatapath()  # the pinned maps: they outlive the agent
    first = enforcers(fake, state)
    store = LocalStore(state, first)
    store.load()
    first.mark_ready()
    store.apply("---".join((CLUSTER_YAML, DNS)))
    wired(first)
    assert holds(fake, expected())

    _, affected = store.apply(ISOLATE_X)  # stored: the change survives the agent
    fake.crash_next(after=1)
    with pytest.raises(OSError):
        first.enforce_now(affected)
    first.stop()  # the agent dies with x/a switched and x/b, x/c not
    new = expected(ISOLATE_X, DNS)
    assert not holds(fake, new)
    writes = (len(fake.installs), fake.service_writes)

    # As the daemon starts: adopt the recorded endpoints, load the store, then ready.
    second = enforcers(fake, state)
    second.start(state.endpoints())
    LocalStore(state, second).load()
    # Nothing is written before ready: what the datapath holds keeps working meanwhile.
    assert not fake.wait_for(lambda f: (len(f.installs), f.service_writes) != writes, 0.3)
    second.mark_ready()

    converged(second, fake, new)
    assert fake.service_addresses == {"10.96.0.10"}
    with second.lock:
        assert {k: second.installed[k] for k in second.endpoints} == {
            key(pod): new[ifindex(pod)] for pod in PODS
        }
    assert_nothing_reported_that_is_not_held(second, fake)
