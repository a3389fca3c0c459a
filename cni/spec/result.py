"""The CNI ADD result, read from and written to every supported spec version.

Internally a result always has the 1.1.0 shape. ``Result.from_json`` up-converts
a result of any version (a ``prevResult`` or a delegated IPAM answer) and
``Result.to_json`` renders it in the version the caller asked for.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from cni.spec.errors import ERR_DECODE, CNIError
from cni.spec.versions import at_least, require_supported


class Fields:
    """``==`` and ``repr`` over the ``__slots__`` (in the fields' order, not sorted),
    as a (mutable) dataclass has them: importing the dataclasses module costs a
    one-call plugin process more than all the classes that use this."""

    __slots__: tuple[str, ...] = ()
    __hash__ = None  # type: ignore[assignment]  # mutable, so not hashable

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"


class Interface(Fields):
    __slots__ = ("name", "mac", "mtu", "sandbox", "socket_path", "pci_id")  # noqa: RUF023

    def __init__(
        self,
        name: str,
        mac: str = "",
        mtu: int = 0,
        sandbox: str = "",
        socket_path: str = "",
        pci_id: str = "",
    ) -> None:
        self.name = name
        self.mac = mac
        self.mtu = mtu
        self.sandbox = sandbox
        self.socket_path = socket_path
        self.pci_id = pci_id


class IPConfig(Fields):
    __slots__ = ("address", "gateway", "interface")

    def __init__(self, address: str, gateway: str = "", interface: int | None = None) -> None:
        self.address = address  # CIDR form, e.g. "10.244.1.5/24"
        self.gateway = gateway
        self.interface = interface

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        return ipaddress.ip_interface(self.address).ip

    @property
    def version(self) -> int:
        return self.ip.version


class Route(Fields):
    __slots__ = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")  # noqa: RUF023

    def __init__(
        self,
        dst: str,
        gw: str = "",
        mtu: int = 0,
        advmss: int = 0,
        priority: int = 0,
        table: int | None = None,
        scope: int | None = None,
    ) -> None:
        self.dst = dst
        self.gw = gw
        self.mtu = mtu
        self.advmss = advmss
        self.priority = priority
        self.table = table
        self.scope = scope


class DNS(Fields):
    __slots__ = ("nameservers", "domain", "search", "options")  # noqa: RUF023

    def __init__(
        self,
        nameservers: list[str] | None = None,
        domain: str = "",
        search: list[str] | None = None,
        options: list[str] | None = None,
    ) -> None:
        self.nameservers: list[str] = [] if nameservers is None else nameservers
        self.domain = domain
        self.search: list[str] = [] if search is None else search
        self.options: list[str] = [] if options is None else options

    def is_empty(self) -> bool:
        return not (self.nameservers or self.domain or self.search or self.options)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nameservers:
            out["nameservers"] = list(self.nameservers)
        if self.domain:
            out["domain"] = self.domain
        if self.search:
            out["search"] = list(self.search)
        if self.options:
            out["options"] = list(self.options)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> DNS:
        if data is None:
            return cls()
        _expect(isinstance(data, dict), f"{where}.dns must be an object")
        return cls(
            nameservers=_str_list(data.get("nameservers"), f"{where}.dns.nameservers"),
            domain=_str(data.get("domain"), f"{where}.dns.domain"),
            search=_str_list(data.get("search"), f"{where}.dns.search"),
            options=_str_list(data.get("options"), f"{where}.dns.options"),
        )


class Result(Fields):
    __slots__ = ("cni_version", "interfaces", "ips", "routes", "dns")  # noqa: RUF023

    def __init__(
        self,
        cni_version: str,
        interfaces: list[Interface] | None = None,
        ips: list[IPConfig] | None = None,
        routes: list[Route] | None = None,
        dns: DNS | None = None,
    ) -> None:
        self.cni_version = cni_version
        self.interfaces: list[Interface] = [] if interfaces is None else interfaces
        self.ips: list[IPConfig] = [] if ips is None else ips
        self.routes: list[Route] = [] if routes is None else routes
        self.dns = DNS() if dns is None else dns

    # -- reading -------------------------------------------------------------

    @classmethod
    def from_json(cls, data: Any, default_version: str, where: str = "result") -> Result:
        """Parse a result of any supported version (missing cniVersion: the config's)."""
        _expect(isinstance(data, dict), f"{where} must be a JSON object")
        version = data.get("cniVersion") or default_version
        _expect(isinstance(version, str), f"{where}.cniVersion must be a string")
        try:
            require_supported(version)
        except CNIError as err:
            raise CNIError(ERR_DECODE, f"{where}: {err.details}") from None
        if at_least(version, "0.3.0"):
            result = cls._from_current(data, version, where)
        else:
            result = cls._from_legacy(data, version, where)
        return result

    @classmethod
    def _from_current(cls, data: dict[str, Any], version: str, where: str) -> Result:
        interfaces = []
        for i, raw in enumerate(_list(data.get("interfaces"), f"{where}.interfaces")):
            w = f"{where}.interfaces[{i}]"
            _expect(isinstance(raw, dict), f"{w} must be an object")
            interfaces.append(
                Interface(
                    name=_str(raw.get("name"), f"{w}.name"),
                    mac=_str(raw.get("mac"), f"{w}.mac"),
                    mtu=_uint(raw.get("mtu"), f"{w}.mtu") or 0,
                    sandbox=_str(raw.get("sandbox"), f"{w}.sandbox"),
                    socket_path=_str(raw.get("socketPath"), f"{w}.socketPath"),
                    pci_id=_str(raw.get("pciID"), f"{w}.pciID"),
                )
            )
        ips = []
        for i, raw in enumerate(_list(data.get("ips"), f"{where}.ips")):
            w = f"{where}.ips[{i}]"
            _expect(isinstance(raw, dict), f"{w} must be an object")
            ips.append(
                IPConfig(
                    address=_cidr(raw.get("address"), f"{w}.address"),
                    gateway=_ip(raw.get("gateway"), f"{w}.gateway"),
                    interface=_uint(raw.get("interface"), f"{w}.interface"),
                )
            )
        routes = [
            _route(raw, f"{where}.routes[{i}]")
            for i, raw in enumerate(_list(data.get("routes"), f"{where}.routes"))
        ]
        return cls(version, interfaces, ips, routes, DNS.from_json(data.get("dns"), where))

    @classmethod
    def _from_legacy(cls, data: dict[str, Any], version: str, where: str) -> Result:
        ips: list[IPConfig] = []
        routes: list[Route] = []
        for key in ("ip4", "ip6"):
            block = data.get(key)
            if block is None:
                continue
            w = f"{where}.{key}"
            _expect(isinstance(block, dict), f"{w} must be an object")
            ips.append(
                IPConfig(
                    address=_cidr(block.get("ip"), f"{w}.ip"),
                    gateway=_ip(block.get("gateway"), f"{w}.gateway"),
                )
            )
            routes += [
                _route(raw, f"{w}.routes[{i}]")
                for i, raw in enumerate(_list(block.get("routes"), f"{w}.routes"))
            ]
        return cls(version, [], ips, routes, DNS.from_json(data.get("dns"), where))

    # -- writing -------------------------------------------------------------

    def to_json(self, version: str) -> dict[str, Any]:
        """Render in ``version``'s format, dropping what that version cannot say."""
        if not at_least(version, "0.3.0"):
            return self._to_legacy(version)
        full = at_least(version, "1.1.0")
        out: dict[str, Any] = {"cniVersion": version}
        if self.interfaces:
            out["interfaces"] = [_interface_json(i, full) for i in self.interfaces]
        if self.ips:
            out["ips"] = [
                _ip_json(ip, with_version=not at_least(version, "1.0.0")) for ip in self.ips
            ]
        if self.routes:
            out["routes"] = [_route_json(r, full) for r in self.routes]
        if not self.dns.is_empty():
            out["dns"] = self.dns.to_json()
        return out

    def _to_legacy(self, version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": version}
        for family, key in ((4, "ip4"), (6, "ip6")):
            ip = next((ip for ip in self.ips if ip.version == family), None)
            if ip is None:
                continue
            block: dict[str, Any] = {"ip": ip.address}
            if ip.gateway:
                block["gateway"] = ip.gateway
            routes = [
                _route_json(r, False)
                for r in self.routes
                if ipaddress.ip_network(r.dst, strict=False).version == family
            ]
            if routes:
                block["routes"] = routes
            out[key] = block
        if "ip4" not in out and "ip6" not in out:
            raise CNIError(ERR_DECODE, f"cannot express a result without addresses in {version}")
        if not self.dns.is_empty():
            out["dns"] = self.dns.to_json()
        return out


def chain(prev: Result | None, ours: Result) -> Result:
    """A plugin's result chained onto prevResult: earlier plugins' entries first, then
    ours, with our IPs' interface indexes shifted past the earlier interfaces."""
    if prev is None:
        return ours
    offset = len(prev.interfaces)
    ips = [
        IPConfig(ip.address, ip.gateway, None if ip.interface is None else ip.interface + offset)
        for ip in ours.ips
    ]
    return Result(
        ours.cni_version,
        interfaces=prev.interfaces + ours.interfaces,
        ips=prev.ips + ips,
        routes=prev.routes + ours.routes,
        dns=ours.dns if not ours.dns.is_empty() else prev.dns,
    )


def _interface_json(iface: Interface, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": iface.name}
    if iface.mac:
        out["mac"] = iface.mac
    if full and iface.mtu:
        out["mtu"] = iface.mtu
    if iface.sandbox:
        out["sandbox"] = iface.sandbox
    if full and iface.socket_path:
        out["socketPath"] = iface.socket_path
    if full and iface.pci_id:
        out["pciID"] = iface.pci_id
    return out


def _ip_json(ip: IPConfig, with_version: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if with_version:  # 0.3.x and 0.4.0 require it
        out["version"] = str(ip.version)
    out["address"] = ip.address
    if ip.gateway:
        out["gateway"] = ip.gateway
    if ip.interface is not None:
        out["interface"] = ip.interface
    return out


def _route_json(route: Route, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"dst": route.dst}
    if route.gw:
        out["gw"] = route.gw
    if full:
        for key in ("mtu", "advmss", "priority"):
            if getattr(route, key):
                out[key] = getattr(route, key)
        if route.table is not None:
            out["table"] = route.table
        if route.scope is not None:
            out["scope"] = route.scope
    return out


def _route(raw: Any, where: str) -> Route:
    _expect(isinstance(raw, dict), f"{where} must be an object")
    return Route(
        dst=_cidr(raw.get("dst"), f"{where}.dst"),
        gw=_ip(raw.get("gw"), f"{where}.gw"),
        mtu=_uint(raw.get("mtu"), f"{where}.mtu") or 0,
        advmss=_uint(raw.get("advmss"), f"{where}.advmss") or 0,
        priority=_uint(raw.get("priority"), f"{where}.priority") or 0,
        table=_uint(raw.get("table"), f"{where}.table"),
        scope=_uint(raw.get("scope"), f"{where}.scope"),
    )


# -- field validation (errors name the field and the bad value) ---------------


def _expect(ok: bool, details: str) -> None:
    if not ok:
        raise CNIError(ERR_DECODE, details)


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    _expect(isinstance(value, list), f"{where} must be a list, not {value!r}")
    return value


def _str(value: Any, where: str) -> str:
    if value is None:
        return ""
    _expect(isinstance(value, str), f"{where} must be a string, not {value!r}")
    return value


def _str_list(value: Any, where: str) -> list[str]:
    items = _list(value, where)
    _expect(all(isinstance(v, str) for v in items), f"{where} must hold strings: {items!r}")
    return list(items)


def _uint(value: Any, where: str) -> int | None:
    if value is None:
        return None
    _expect(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        f"{where} must be a non-negative integer, not {value!r}",
    )
    return value


def _cidr(value: Any, where: str) -> str:
    _expect(isinstance(value, str), f"{where} must be an address in CIDR form, not {value!r}")
    _expect("/" in value, f"{where} {value!r} has no prefix length")
    try:
        ipaddress.ip_interface(value)
    except ValueError:
        raise CNIError(ERR_DECODE, f"{where} {value!r} is not an address in CIDR form") from None
    return value


def _ip(value: Any, where: str) -> str:
    if value in (None, ""):
        return ""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise CNIError(ERR_DECODE, f"{where} {value!r} is not an IP address") from None
