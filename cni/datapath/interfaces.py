"""What the agent's enforcer and the plugin's wiring need of the datapath, as Protocols.

The enforcer (``cni.agent.enforcer``) decides which policy each endpoint must
have; the datapath makes it the live one in the kernel's maps. Between the two
is ``PolicyWriter``: the enforcer holds one and calls nothing else of the
datapath. On a node it is ``cni.datapath.policy_writer.DatapathPolicyWriter``
(the pinned maps, rule sets shared by content); in tests it is an in-memory
writer that records what it was given and can fail a write as the kernel can,
so the enforcer's ordering and failure handling are tested without root.

A writer's failures come in two kinds, handled differently by the enforcer:

- an endpoint whose policy cannot be installed (rules that do not compile, an
  ifindex that is no endpoint) is left as it is and reported in ``failed``;
  the other endpoints of the batch are installed;
- an ``OSError`` (a map write the kernel refused) ends the batch: some of its
  endpoints may have been switched already, none is reported installed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the plugin's wiring loads this module on every ADD: types only
    from cni.policy.vocabulary import EndpointPolicy, PolicyError


class PolicyWriter(Protocol):
    """Installs endpoints' policies and the Services' addresses in a datapath."""

    def install_many(
        self, wanted: Mapping[int, EndpointPolicy], failed: dict[int, PolicyError]
    ) -> dict[int, int]:
        """Make each ``wanted[ifindex]`` that endpoint's live policy, in one write per
        endpoint; return {ifindex: generation} of those installed. An endpoint that
        cannot have its policy is left as it is and put in ``failed``; OSError when
        the datapath refuses a write."""
        ...

    def set_service_addresses(self, addresses: Iterable[str]) -> None:
        """Make ``addresses`` the set of Service ClusterIPs that egress rules let
        through; one that stays in the set is never absent meanwhile."""
        ...


class EndpointRegistry(Protocol):
    """A pod's node-side veth in the datapath: its programs and its endpoint entries.

    The plugin's wiring (``cni.plugin.podnet``) holds one and calls nothing else
    of the datapath. On a node it is ``cni.datapath.endpoint.DatapathEndpoints``
    over the caller's open ``Datapath``; tests may give a recording one. Every
    failure is a ``CNIError`` (the kernel refused an attach or a map write).
    Removal comes after the veth is gone or down, never before: ``detach`` once
    it is deleted; ``forget`` once it is down, then ``release_links`` once it is
    deleted."""

    def attach(self, ifindex: int, name: str, tcx: bool) -> None:
        """The programs on a new veth's hooks (tcx links, or clsact filters)."""
        ...

    def register(self, ifindex: int, name: str, ips: list[str]) -> None:
        """The endpoint's entries: its addresses (any other source is spoofed) and
        an empty conntrack table of its own."""
        ...

    def detach(self, ifindex: int, ips: list[str] | None) -> None:
        """The entries and links of an endpoint whose veth is deleted."""
        ...

    def forget(self, ifindex: int, ips: list[str]) -> None:
        """The entries of an endpoint whose veth is down; its links stay."""
        ...

    def release_links(self, ifindex: int) -> None:
        """The links of a forgotten endpoint, once its veth is deleted."""
        ...

    def forget_gone(self, ips: list[str]) -> None:
        """Every endpoint registered for ``ips`` whose veth no longer exists."""
        ...

    def sweep_gone(self) -> None:
        """Every endpoint, and every link, whose veth no longer exists."""
        ...
