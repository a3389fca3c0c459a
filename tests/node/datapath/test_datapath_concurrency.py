"""ADD, DEL, GC (processes running the real plugin) and policy installs (the Python
API) against one datapath for a minute; afterwards every live pod is attached with
its current policy, and nothing of a gone veth is left in the pinned state."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cni.datapath import attach, bpf, bpf_links, ctpool, endpoint
from cni.datapath import policy_install as P
from cni.datapath.maps import Datapath, ct_key
from cni.datapath.structs import CT_SHARES
from cni.policy.vocabulary import AllowRule, EndpointPolicy, PolicyError, Ports
from tests.harness.cni_run import TEST_BPF_DIR, Network, PodNamespaces, node_veth

SECONDS = float(os.environ.get("SLUICE_CHURN_SECONDS", "60"))
WORKERS = 3
AHEAD = 20


def test_add_del_gc_and_installs_race_for_a_minute(network: Network, pods: PodNamespaces) -> None:
    lock = threading.Lock()
    live: dict[str, tuple[str, int]] = {}  # container id -> (netns, ifindex), wired
    valid: set[str] = set()  # ADD started or wired, DEL not finished: valid for GC
    installed: dict[int, int] = {}  # ifindex -> generation the last install returned
    errors: list[str] = []
    stop = time.monotonic() + SECONDS
    counts = {"add": 0, "del": 0, "gc": 0, "install": 0, "abandoned": 0}

    def worker(n: int) -> None:
        """ADD, then DEL (60 %), keep (25 %) or abandon (15 %: only GC removes it). As a
        runtime would, it never runs GC without its next attachments in the valid list:
        it reserves its next AHEAD container ids."""
        rng = random.Random(n)
        i = 0
        with lock:
            valid.update(f"churn{n}x{k}" for k in range(1, AHEAD + 1))
        while time.monotonic() < stop:
            i += 1
            cid = f"churn{n}x{i}"
            netns = pods.new()
            with lock:
                valid.add(f"churn{n}x{i + AHEAD}")
            try:
                result = network.add(netns, cid)
            except AssertionError as err:
                errors.append(f"ADD {cid}: {err}")
                with lock:
                    valid.discard(cid)
                continue
            _, ifindex = node_veth(result)
            with lock:
                live[cid] = (netns, ifindex)
                counts["add"] += 1
            draw = rng.random()
            if draw > 0.85:
                with lock:
                    live.pop(cid)
                    installed.pop(ifindex, None)
                    valid.discard(cid)
                    counts["abandoned"] += 1
            elif draw < 0.6:
                time.sleep(rng.random() * 0.5)
                with lock:
                    live.pop(cid)
                    installed.pop(ifindex, None)
                run = network.delete(netns, cid)
                if run.rc != 0:
                    errors.append(f"DEL {cid}: {run.stdout}")
                with lock:
                    valid.discard(cid)
                    counts["del"] += 1
                pods.remove(netns)

    def collector() -> None:
        while time.monotonic() < stop:
            time.sleep(1.5)
            with lock:
                attachments = [{"containerID": c, "ifname": "eth0"} for c in valid]
            run = network.run("GC", network.config(**{"cni.dev/valid-attachments": attachments}))
            if run.rc != 0:
                errors.append(f"GC: {run.stdout}")
            counts["gc"] += 1

    def installer() -> None:
        rng = random.Random(99)
        with Datapath(TEST_BPF_DIR) as dp:
            while time.monotonic() < stop:
                with lock:
                    targets = [ifindex for _, ifindex in live.values()]
                if not targets:
                    time.sleep(0.05)
                    continue
                ifindex = rng.choice(targets)
                port = rng.randint(1, 65535)
                policy = EndpointPolicy(
                    ingress=(AllowRule(ports=(Ports("tcp", port),)),),
                    egress=None if rng.random() < 0.5 else (),
                )
                try:
                    gen = P.install(dp, ifindex, policy)
                except PolicyError:
                    continue  # deleted meanwhile
                with lock:
                    if any(i == ifindex for _, i in live.values()):
                        installed[ifindex] = gen
                    counts["install"] += 1

    def guarded(target: Callable[..., None], *args: int) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except Exception as err:  # a thread's failure fails the test
                errors.append(f"{target.__name__}: {err!r}")

        return threading.Thread(target=run)

    threads = [guarded(worker, n) for n in range(WORKERS)]
    threads += [guarded(collector), guarded(installer)]
    try:
        for thread in threads:
            thread.start()
    finally:
        for thread in threads:
            thread.join()

    assert not errors, errors[:5]
    assert counts["add"] >= 5 and counts["del"] >= 2 and counts["gc"] >= 3, counts
    assert counts["install"] >= 20, counts
    # One more GC after the churn: what was abandoned last goes too.
    with lock:
        attachments = [{"containerID": c, "ifname": "eth0"} for c in valid]
    network.run("GC", network.config(**{"cni.dev/valid-attachments": attachments})).ok()
    check_state(live, installed)
    for cid, (netns, _) in list(live.items()):
        network.delete(netns, cid).ok()
    with Datapath(TEST_BPF_DIR) as dp:
        mine = {i for _, i in live.values()}
        assert not mine & set(dp.endpoints.all()), "DEL removed every endpoint"


def check_state(live: dict[str, tuple[str, int]], installed: dict[int, int]) -> None:
    alive = endpoint.live_ifindexes()
    with Datapath(TEST_BPF_DIR) as dp:
        endpoints = dp.endpoints.all()
        policy_ids = dp.policies.ids()
        for cid, (_, ifindex) in live.items():
            ep = endpoints.get(ifindex)
            assert ep is not None, f"{cid} has no endpoint"
            for program in attach.HOOKS:
                path = attach.link_path(TEST_BPF_DIR, ifindex, program)
                fd = bpf.obj_get(path)
                try:
                    assert bpf_links.link_info(fd).ifindex == ifindex, f"{cid}: {program} detached"
                finally:
                    os.close(fd)
            assert ifindex in dp.conntrack.tables(), f"{cid} lost its conntrack table"
            if ifindex in installed:
                gen = installed[ifindex]
                assert ep.policy_gen == gen, f"{cid}: generation {ep.policy_gen}, not {gen}"
                assert ep.ingress_policy in policy_ids, f"{cid}: its live policy maps are gone"
        # Nothing of a gone veth, and no garbage after the last GC's reap.
        links = Path(TEST_BPF_DIR, attach.LINKS)
        for pin in links.iterdir() if links.exists() else ():
            assert int(pin.name.split("_")[0]) in alive, f"stale link pin {pin.name}"
        assert set(endpoints) <= alive, "endpoints of gone veths"
        assert set(dp.conntrack.tables()) <= alive, "conntrack tables of gone veths"
        assert set(dp.endpoints.ips().values()) <= alive, "addresses of gone veths"
        referenced = {ep.policy(d) for ep in endpoints.values() for d in (0, 1)} - {0}
        assert policy_ids == referenced, "policy maps no endpoint uses, or missing ones"
        tables = set(dp.inner_maps("ct_tables"))
        in_use = {ep.ct_slot for ep in endpoints.values()}
        wanted = {ct_key(s, i) for s in in_use | set(ctpool.free_tables(dp)) for i in CT_SHARES}
        assert tables == wanted, "tables neither in use nor free, or a share missing"
        assert not ctpool.dirty_tables(dp), "dirty tables left after GC"
