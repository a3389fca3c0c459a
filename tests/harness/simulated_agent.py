"""A node agent without a kernel: the agent's real sources and enforcer for one node,
writing into a datapath in memory (``tests.harness.fake_datapath``) that records
what would have been installed.

For tests and benchmarks against a real API server with nodes that do not exist:
``SimulatedAgent(api, node, resolver)`` watches what ``sluicectl agent --resolver
<resolver>`` would watch, and ``wire`` stands for CNI ADDs of the node's pods (each
waits, as a real ADD does, until the pod's policy can be computed).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from cni.agent.enforcer import Enforcer
from cni.agent.kube_source import COLLECTIONS, KubernetesSource
from cni.agent.shard_source import controller_collections
from cni.agent.state import EndpointRecord
from cni.kube.api import Api
from cni.policy.model import PodKey
from cni.policy.published.index import ShardIndex
from cni.policy.vocabulary import EndpointPolicy
from tests.harness.fake_datapath import FakeDatapath, Install

__all__ = ["FakeDatapath", "Install", "NullState", "SimulatedAgent", "recorded_installs"]


@contextmanager
def recorded_installs() -> Iterator[None]:
    """Nothing to arrange: every SimulatedAgent's enforcer writes into its own
    FakeDatapath (``agent.datapath``). Kept for the callers that wrap their agents."""
    yield


class NullState:
    """The agent's state database, not kept."""

    def put_endpoint(self, record: EndpointRecord) -> None:
        pass

    def remove_endpoint(self, key: tuple[str, str]) -> None:
        pass


class SimulatedAgent:
    _ifindexes = itertools.count(1000)

    def __init__(self, api: Api, node: str, resolver: str = "controller") -> None:
        self.api = api
        self.node = node
        self.resolver = resolver
        self.datapath = FakeDatapath()
        index = ShardIndex(node) if resolver == "controller" else None
        self.enforcer = Enforcer(
            self.datapath,
            NullState(),  # type: ignore[arg-type]
            node,
            index=index,
        )
        collections = controller_collections(node) if resolver == "controller" else COLLECTIONS
        self.source = KubernetesSource(api, self.enforcer, collections)
        self.ifindex: dict[PodKey, int] = {}

    def start(self) -> None:
        self.enforcer.start([])
        self.source.start()

    def stop(self) -> None:
        self.source.stop()
        self.enforcer.stop()

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.enforcer.wait_ready(timeout)

    def wire(self, pod: PodKey, ips: tuple[str, ...], wait: float = 30.0) -> int:
        """A CNI ADD of the pod: its endpoint, its policy installed before it returns."""
        ifindex = self.ifindex.get(pod) or next(self._ifindexes)
        self.ifindex[pod] = ifindex
        record = EndpointRecord(f"c-{pod[0]}-{pod[1]}", "eth0", ifindex, ips, pod[0], pod[1])
        self.enforcer.endpoint_up(record, wait)
        return ifindex

    def unwire(self, pod: PodKey) -> None:
        ifindex = self.ifindex.pop(pod, None)
        if ifindex is not None:
            self.enforcer.endpoint_gone((f"c-{pod[0]}-{pod[1]}", "eth0"))

    def policy_of(self, pod: PodKey) -> EndpointPolicy | None:
        """What the datapath holds for the pod now (None: nothing installed)."""
        return self.datapath.current.get(self.ifindex[pod])
