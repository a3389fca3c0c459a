"""CNI specification versions: what sluice speaks and which verb needs what."""

from __future__ import annotations

from cni.spec.errors import ERR_INCOMPATIBLE_VERSION, CNIError

CURRENT = "1.1.0"
SUPPORTED = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

# The first version that defines each verb (ADD and DEL exist in all).
MINIMUM_FOR_VERB = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}


def parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def require_supported(version: str) -> None:
    if version not in SUPPORTED:
        raise CNIError(
            ERR_INCOMPATIBLE_VERSION,
            f'config version "{version}" is not supported; sluice supports {list(SUPPORTED)}',
            msg="incompatible CNI versions",
        )


def require_verb_allowed(command: str, version: str) -> None:
    minimum = MINIMUM_FOR_VERB.get(command)
    if minimum and not at_least(version, minimum):
        raise CNIError(
            ERR_INCOMPATIBLE_VERSION,
            f'config version "{version}" does not allow {command} (needs {minimum} or later)',
        )


def echoed_version(request_version: str | None) -> str:
    """VERSION answers with the caller's version when it is one sluice knows."""
    return request_version if request_version in SUPPORTED else CURRENT
