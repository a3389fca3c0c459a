"""The optional "datapath" object of the sluice plugin config.

    "datapath": {"conntrackPerEndpoint": 4096, "maxEndpoints": 16384,
                 "maxServices": 65536, "eventsPerSecond": 100, "eventsBurst": 200,
                 "tcpSynTimeout": 60, "tcpEstablishedTimeout": 8000,
                 "tcpClosingTimeout": 10, "udpTimeout": 60, "otherTimeout": 60,
                 "fragmentTimeout": 30}

Every key is optional. ``maxEndpoints`` and ``maxServices`` size maps that
are compiled in: changing them needs ``sluicectl datapath load --replace``.
The others are tunables in the pinned config map, applied by every
``sluicectl datapath load``; ``conntrackPerEndpoint`` sizes the conntrack
table of each endpoint attached afterwards.

``"attach"`` chooses how the programs go onto each new pod's veth: ``"tcx"``
(the default; links, no qdisc, so other tc users such as the bandwidth plugin
keep working beside them) or ``"tc"`` (a clsact qdisc with direct-action
filters, what kernels without tcx get anyway). Each tcx link makes the
kernel wait for an RCU grace period while it holds the RTNL lock, some 10 to
25 ms per ADD that every other netlink user on the node waits out too; tc
filters attach in about 2 ms, but the clsact qdisc excludes another ingress
qdisc on the veth, so ``"tc"`` cannot be chained with ``bandwidth``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# config key -> (field, smallest, largest)
KEYS = {
    "conntrackPerEndpoint": ("conntrack_per_endpoint", 16, 1 << 24),
    "maxEndpoints": ("max_endpoints", 16, 1 << 20),
    "maxServices": ("max_services", 16, 1 << 22),
    "eventsPerSecond": ("events_per_second", 0, 1_000_000),
    "eventsBurst": ("events_burst", 1, 1_000_000),
    "tcpSynTimeout": ("ct_tcp_syn", 1, 86400),
    "tcpEstablishedTimeout": ("ct_tcp_established", 1, 7 * 86400),
    "tcpClosingTimeout": ("ct_tcp_closing", 1, 86400),
    "udpTimeout": ("ct_udp", 1, 86400),
    "otherTimeout": ("ct_other", 1, 86400),
    "fragmentTimeout": ("ct_fragment", 1, 600),
}
ATTACH_MODES = ("tcx", "tc")
# Fields that live in the pinned config map (sl_config), by the same name.
TUNABLES = (
    "ct_tcp_syn",
    "ct_tcp_established",
    "ct_tcp_closing",
    "ct_udp",
    "ct_other",
    "ct_fragment",
    "events_per_second",
    "events_burst",
)


class DatapathSettings(NamedTuple):
    conntrack_per_endpoint: int = 4096
    max_endpoints: int = 16384
    max_services: int = 65536
    events_per_second: int = 100
    events_burst: int = 200
    ct_tcp_syn: int = 60
    ct_tcp_established: int = 8000
    ct_tcp_closing: int = 10
    ct_udp: int = 60
    ct_other: int = 60
    ct_fragment: int = 30
    attach: str = "tcx"  # how programs go onto pod veths (not part of the pinned state)

    def config_fields(self) -> dict[str, int]:
        """The values of the pinned config map (sl_config)."""
        values = {name: getattr(self, name) for name in TUNABLES}
        values["ct_per_endpoint"] = self.conntrack_per_endpoint
        return values

    def compiled(self) -> dict[str, int]:
        """Sizes compiled into the programs (-D), part of the pinned layout."""
        return {"SL_MAX_ENDPOINTS": self.max_endpoints, "SL_MAX_SERVICES": self.max_services}


def parse(value: Any) -> DatapathSettings:
    """Settings from the plugin config's "datapath" value (None: the defaults).

    ValueError names the key and the value at fault."""
    if value is None:
        return DatapathSettings()
    if not isinstance(value, dict):
        raise ValueError(f'"datapath" must be an object, not {value!r}')
    chosen: dict[str, Any] = {}
    for key, setting in value.items():
        if key == "attach":
            if setting not in ATTACH_MODES:
                raise ValueError(
                    f'"datapath.attach" is {setting!r}: expected one of {list(ATTACH_MODES)}'
                )
            chosen["attach"] = setting
            continue
        if key not in KEYS:
            known = ", ".join(sorted([*KEYS, "attach"]))
            raise ValueError(f'"datapath" has an unknown key "{key}" (known: {known})')
        name, low, high = KEYS[key]
        if isinstance(setting, bool) or not isinstance(setting, int):
            raise ValueError(f'"datapath.{key}" must be an integer, not {setting!r}')
        if not low <= setting <= high:
            raise ValueError(f'"datapath.{key}" is {setting}, outside {low}..{high}')
        chosen[name] = setting
    settings = DatapathSettings(**chosen)
    assert set(settings._fields) >= set(chosen)
    return settings


def from_plugin(plugin: dict[str, Any]) -> DatapathSettings:
    """Settings of a conflist's sluice plugin entry."""
    return parse(plugin.get("datapath"))
