"""Reading a Kubernetes object's fields as the API server validates them: names,
labels, selectors, ports, addresses. Every error names the object, the field path
and the value (``PolicyInputError``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from cni.policy.addresses import MAPPED_REFUSAL, IPNetwork, legacy_cidr, legacy_ip
from cni.policy.errors import MISSING, PolicyInputError
from cni.policy.model import OPERATORS, PROTOCOLS, Labels, LabelSelector, Requirement, labels_of

API_VERSIONS = {
    "Namespace": "v1",
    "Pod": "v1",
    "Service": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class FieldReader:
    """Reads one object's fields; every error names the object and the field path."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.what = kind

    def fail(self, path: str, value: object, problem: str) -> NoReturn:
        raise PolicyInputError(self.what, path, value, problem)

    def api_version(self, obj: Mapping[str, Any]) -> None:
        """An ``apiVersion`` may be left out; when given, it is the kind's."""
        version = obj.get("apiVersion")
        if version is not None and version != API_VERSIONS[self.kind]:
            self.fail("apiVersion", version, f"is not {API_VERSIONS[self.kind]}")

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, value, "must be an object")
        return value

    def items(self, value: object, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, value, "must be a list")
        return value

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, MISSING if value is None else value, "must be a string")
        return value

    def integer(self, value: object, path: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, value, "must be an integer")
        if not low <= value <= high:
            self.fail(path, value, f"is not between {low} and {high}")
        return value

    def boolean(self, value: object, path: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            self.fail(path, value, "must be true or false")
        return value

    def metadata(self, obj: Mapping[str, Any], namespaced: bool) -> tuple[str, str]:
        """(namespace, name), and from here on errors name the object."""
        meta = self.mapping(obj.get("metadata"), "metadata")
        name = meta.get("name")
        if name is None:
            self.fail("metadata.name", MISSING, "is required")
        self.string(name, "metadata.name")
        namespace = ""
        if namespaced:
            namespace = self.string(meta.get("namespace") or "default", "metadata.namespace")
            self.what = f"{self.kind} {namespace}/{name}"
            self.dns_name(namespace, "metadata.namespace", label=True)
            self.dns_name(name, "metadata.name", label=False)
        else:
            self.what = f"{self.kind} {name}"
            self.dns_name(name, "metadata.name", label=True)
        return sys.intern(namespace), name

    def dns_name(self, value: str, path: str, label: bool) -> None:
        pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
        if len(value) > limit or not pattern.fullmatch(value):
            self.fail(
                path,
                value,
                f"is not a valid name: at most {limit} lower-case letters, digits, '-'"
                + ("" if label else " and '.'")
                + ", starting and ending with a letter or digit",
            )

    def label_key(self, value: object, path: str) -> str:
        key = self.string(value, path)
        parts = key.split("/")
        name = parts[-1]
        bad_prefix = len(parts) > 2 or (
            len(parts) == 2 and (len(parts[0]) > 253 or not _DNS_SUBDOMAIN.fullmatch(parts[0]))
        )
        if bad_prefix or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
            self.fail(
                path,
                key,
                "is not a valid label key: an optional DNS subdomain prefix and '/', then "
                "at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
                "letter or digit",
            )
        return key

    def label_value(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, value, "must be a string (quote it in YAML)")
        if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
            self.fail(
                path,
                value,
                "is not a valid label value: empty, or at most 63 letters, digits, '-', '_' "
                "or '.', starting and ending with a letter or digit",
            )
        return value

    def labels(self, value: object, path: str) -> Labels:
        pairs = self.mapping(value, path)
        return labels_of(
            (self.label_key(k, path), self.label_value(v, f"{path}[{k}]")) for k, v in pairs.items()
        )

    def selector(self, value: object, path: str) -> LabelSelector:
        spec = self.mapping(value, path)
        match_labels = self.labels(spec.get("matchLabels"), f"{path}.matchLabels")
        requirements = []
        for i, item in enumerate(
            self.items(spec.get("matchExpressions"), f"{path}.matchExpressions")
        ):
            at = f"{path}.matchExpressions[{i}]"
            item = self.mapping(item, at)
            key = self.label_key(item.get("key"), f"{at}.key")
            operator = item.get("operator")
            if operator not in OPERATORS:
                self.fail(f"{at}.operator", operator, "is not one of " + ", ".join(OPERATORS))
            values = self.items(item.get("values"), f"{at}.values")
            if operator in ("In", "NotIn") and not values:
                self.fail(f"{at}.values", values, f"must not be empty when operator is {operator}")
            if operator in ("Exists", "DoesNotExist") and values:
                self.fail(f"{at}.values", values, f"must be empty when operator is {operator}")
            checked = frozenset(
                sys.intern(self.label_value(v, f"{at}.values[{j}]")) for j, v in enumerate(values)
            )
            requirements.append(Requirement(sys.intern(key), operator, checked))
        # Canonical order, so that equal selectors are one cache entry.
        requirements = sorted(
            set(requirements), key=lambda r: (r.key, r.operator, sorted(r.values))
        )
        return LabelSelector(match_labels, tuple(requirements))

    def protocol(self, value: object, path: str) -> str:
        if value is None:
            return "TCP"
        if value not in PROTOCOLS:
            self.fail(path, value, "is not one of " + ", ".join(PROTOCOLS))
        return str(value)

    def port_name(self, value: str, path: str) -> str:
        if (
            len(value) > 15
            or not _PORT_NAME.fullmatch(value)
            or "--" in value
            or not re.search("[a-z]", value)
        ):
            self.fail(
                path,
                value,
                "is not a valid port name: at most 15 lower-case letters, digits and '-', "
                "with at least one letter",
            )
        return sys.intern(value)

    def ip(self, value: object, path: str) -> str:
        try:
            return str(legacy_ip(self.string(value, path)))
        except ValueError:
            self.fail(path, value, "is not an IP address")

    def cidr(self, value: object, path: str) -> IPNetwork:
        text = self.string(value, path)
        try:
            return legacy_cidr(text)
        except ValueError as err:
            mapped = str(err) == MAPPED_REFUSAL
            self.fail(path, value, MAPPED_REFUSAL if mapped else "is not a valid CIDR")
