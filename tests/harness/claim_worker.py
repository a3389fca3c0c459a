"""One simulated node's IPAM with its claims in the Kubernetes API, as the agent runs
it (``cni.agent.prefix_claims.AgentClaims``, the same store and reconciliation), in
a process of its own: ``python -m tests.harness.claim_worker JOB`` where JOB is JSON:

- ``kubeconfig``, ``network``, ``plugin`` (the plugin object: ``stateDir``, ``ipam``);
- ``count`` attachments to allocate (``-1``: until killed), over ``threads`` threads
  (as the agent serves concurrent CNI calls), named ``<prefix>-<thread>-<i>``;
- ``barrier``: print ``{"ready": ...}`` once the claims are listed and wait for a line
  on stdin, so that every worker starts claiming at once;
- ``release``: release every attachment at the end and reconcile (blocks go back).

Every allocation is printed as it commits (``{"ip", "attachment"}``), then a last line
``{"done": true, "held", "ips", "conflicts", "errors"}``.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from cni.agent.prefix_claims import AgentClaims
from ipam import config as ipam_config
from ipam.errors import IPAMError
from ipam.modes import open_allocator
from ipam.prefix import PrefixAllocator

_print_lock = threading.Lock()


def say(obj: dict[str, Any]) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def allocate(config: ipam_config.PrefixConfig, prefix: str, count: int, errors: list[str]) -> None:
    i = 0
    while count < 0 or i < count:
        name = f"{prefix}-{i}"
        try:
            with open_allocator(config, threads=True) as allocator:
                allocation, _ = allocator.allocate(name, "eth0")
            say({"ip": str(allocation.ip), "attachment": name})
        except IPAMError as err:
            errors.append(f"{type(err).__name__}: {err}")
        i += 1


def main() -> int:
    job = json.loads(sys.argv[1])
    config = ipam_config.from_plugin(job["network"], job["plugin"])
    assert isinstance(config, ipam_config.PrefixConfig)
    claims = AgentClaims(config, job["kubeconfig"])
    claims.start()
    try:
        if job.get("barrier"):
            say({"ready": claims.reconcile()})
            sys.stdin.readline()
        errors: list[str] = []
        threads = int(job.get("threads", 1))
        count = int(job.get("count", 0))
        workers = [
            threading.Thread(
                target=allocate,
                args=(config, f"{job.get('prefix', 'c')}-{t}", count // threads, errors),
            )
            for t in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        with open_allocator(config, threads=True) as allocator:
            assert isinstance(allocator, PrefixAllocator)
            if job.get("release"):
                allocator.gc(set())
            held = [str(b) for b in allocator.reconcile()]
            ips = sorted(str(a.ip) for a in allocator.allocations())
        say(
            {
                "done": True,
                "held": held,
                "ips": ips,
                "conflicts": claims.store.conflicts,
                "errors": errors,
            }
        )
    finally:
        claims.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
