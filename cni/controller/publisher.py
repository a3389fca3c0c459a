"""The controller's state, one receiver for its informers: the cluster's objects
(``DesiredState``), what is published (``Ledger``), and the plans that bring the
second to the first (``Planner``).

Every object comes in by its type, the cluster's and the controller's own alike;
an object of ours that the API shows changed, or a write of it that failed, has
its set planned again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cni.controller.desired import DesiredState
from cni.controller.ledger import Ledger
from cni.controller.planner import ADDRESS_SET_CAPACITY, TARGETS_CAPACITY, Plan, Planner, Write
from cni.policy.index import PolicyIndex
from cni.policy.kinds import ByKind, KindHandlers
from cni.policy.model import Namespace, NetworkPolicy, Pod, PodKey, PolicyKey
from cni.policy.published.identity import INFO_TYPES, ShardInfo

# The capacities are the defaults of ``sluicectl controller`` too, which takes them here.
__all__ = ["ADDRESS_SET_CAPACITY", "TARGETS_CAPACITY", "Publisher"]


class Publisher:
    """``DesiredState``, ``Ledger`` and ``Planner`` behind what their callers do with
    them together. A facade, kept for two reasons: its callers hand over objects of
    both sides by type (the controller's informers: one ``ByKind`` over the cluster's
    kinds and the published ones), and what the ledger learns (``observe``,
    ``forget``, a relist) must reach the planner as sets to plan again.

    Each method hands to one piece: ``put_*``/``remove_*`` are ``desired``'s, for
    callers that feed the cluster's objects typed, one at a time. Status and
    anything else is read from ``desired``, ``ledger`` or ``planner``."""

    def __init__(
        self,
        capacity: int = ADDRESS_SET_CAPACITY,
        targets_capacity: int = TARGETS_CAPACITY,
    ) -> None:
        self.desired = DesiredState()
        self.ledger = Ledger()
        self.planner = Planner(self.desired, self.ledger, capacity, targets_capacity)
        handlers = self.desired.handlers()
        for kind, info_type in INFO_TYPES.items():
            handlers[info_type] = self._published_handlers(kind)
        self.kinds: ByKind[None] = ByKind(handlers, lambda _: None, "the publisher")

    @property
    def index(self) -> PolicyIndex:
        return self.desired.index

    # -- objects by type ----------------------------------------------------------------------

    def upsert(self, obj: Any) -> None:
        self.kinds.upsert(obj)

    def delete(self, obj: Any) -> None:
        self.kinds.delete(obj)

    def replace_all(self, kind: type, items: Iterable[Any]) -> None:
        self.kinds.replace_all(kind, items)

    # -- the cluster's objects ----------------------------------------------------------------

    def put_namespace(self, namespace: Namespace) -> None:
        self.desired.put_namespace(namespace)

    def remove_namespace(self, name: str) -> None:
        self.desired.remove_namespace(name)

    def put_pod(self, pod: Pod) -> None:
        self.desired.put_pod(pod)

    def remove_pod(self, key: PodKey) -> None:
        self.desired.remove_pod(key)

    def put_policy(self, policy: NetworkPolicy, uid: str, generation: int) -> None:
        self.desired.put_policy(policy, uid, generation)

    def remove_policy(self, key: PolicyKey) -> None:
        self.desired.remove_policy(key)

    # -- what is published --------------------------------------------------------------------

    def observe(self, info: ShardInfo) -> None:
        """An object of ours as the API has it now (listed, watched, or just written)."""
        if self.ledger.observe(info):
            self.planner.recheck(info)

    def forget(self, info: ShardInfo) -> None:
        """An object of ours is gone."""
        if self.ledger.forget(info):
            self.planner.recheck(info)

    def published_count(self) -> int:
        return self.ledger.count()

    def _published_handlers(self, kind: str) -> KindHandlers[None]:
        def replace(infos: Iterable[ShardInfo]) -> None:
            for info in self.ledger.replace(kind, infos):
                self.planner.recheck(info)

        return KindHandlers(self.observe, self.forget, replace=replace)

    # -- planning -----------------------------------------------------------------------------

    def pending(self) -> bool:
        return self.planner.pending()

    def plan(self) -> Plan:
        return self.planner.plan()

    def replan(self, write_or_deletion: Write | ShardInfo) -> None:
        self.planner.replan(write_or_deletion)

    def recompute_everything(self) -> None:
        self.planner.recompute_everything()
