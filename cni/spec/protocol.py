"""The CNI execution protocol: environment and stdin in, a validated request out.

Standard library only: this runs for every plugin call before anything heavy
is imported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from cni.spec import versions
from cni.spec.attachment import Attachment
from cni.spec.errors import (
    ERR_DECODE,
    ERR_INVALID_CONFIG,
    ERR_INVALID_ENV,
    CNIError,
)
from cni.spec.result import Fields, Result

COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")

# Variables a verb cannot work without. CNI_PATH is only needed when a
# delegated plugin must be found, so it is checked there.
REQUIRED_ENV = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "STATUS": (),
    "GC": (),
}

# Same rules as libcni (pkg/utils): container ids and network names.
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
IFNAME_MAX = 15

MAC_PATTERN = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")

# CNI_ARGS keys sluice knows. Kubernetes runtimes send the K8S_POD_* keys with
# IgnoreUnknown=1; the pod keys are accepted even without it.
KNOWN_ARGS = (
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
    "MAC",
)


class Request(Fields):
    __slots__ = (  # noqa: RUF023
        "command",
        "cni_version",
        "network",
        "config",
        "raw_config",
        "env",
        "container_id",
        "netns",
        "ifname",
        "args",
    )

    def __init__(
        self,
        command: str,
        cni_version: str,
        network: str,
        config: dict[str, Any],
        raw_config: bytes,
        env: Mapping[str, str],
        container_id: str = "",
        netns: str = "",
        ifname: str = "",
        args: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.cni_version = cni_version
        self.network = network
        self.config = config
        self.raw_config = raw_config  # passed unchanged to delegated plugins
        self.env = env
        self.container_id = container_id
        self.netns = netns
        self.ifname = ifname
        self.args: dict[str, str] = {} if args is None else args

    @property
    def plugin_path(self) -> tuple[str, ...]:
        return tuple(p for p in self.env.get("CNI_PATH", "").split(":") if p)

    @property
    def attachment(self) -> Attachment:
        return Attachment(
            self.network,
            self.container_id,
            self.ifname,
            self.netns,
            self.args.get("K8S_POD_NAMESPACE", ""),
            self.args.get("K8S_POD_NAME", ""),
        )

    def runtime_config(self, key: str) -> Any:
        """A capability argument, matched case-insensitively.

        containerd sends Go struct field names (``HostPort``, ``Mac``) where the
        conventions document lower camel case, so both must work. A key the
        plugin did not declare in ``capabilities`` is ignored when the runtime
        left that list in the request.
        """
        runtime = self.config.get("runtimeConfig")
        if not isinstance(runtime, dict):
            return None
        declared = self.config.get("capabilities")
        if isinstance(declared, dict) and not _lookup(declared, key):
            return None
        return _lookup(runtime, key)


def _lookup(mapping: dict[str, Any], key: str) -> Any:
    if key in mapping:
        return mapping[key]
    folded = key.casefold()
    for name, value in mapping.items():
        if isinstance(name, str) and name.casefold() == folded:
            return value
    return None


def read_command(env: Mapping[str, str]) -> str:
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise CNIError(ERR_INVALID_ENV, "required environment variable CNI_COMMAND is missing")
    if command not in COMMANDS:
        raise CNIError(ERR_INVALID_ENV, f"unknown CNI_COMMAND: {command}")
    return command


def decode_config(stdin: bytes) -> dict[str, Any]:
    try:
        config = json.loads(stdin)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CNIError(ERR_DECODE, f"network configuration on stdin is not JSON: {err}") from None
    if not isinstance(config, dict):
        raise CNIError(ERR_DECODE, "network configuration on stdin must be a JSON object")
    return config


def config_version(config: Mapping[str, Any]) -> str:
    # As libcni decodes it: a config without cniVersion is 0.1.0.
    version = config.get("cniVersion") or "0.1.0"
    if not isinstance(version, str):
        raise CNIError(ERR_DECODE, f"cniVersion must be a string, not {version!r}")
    return version


def parse_request(command: str, env: Mapping[str, str], stdin: bytes) -> Request:
    """Validate everything a verb relies on; raise CNIError naming what is wrong."""
    config = decode_config(stdin)
    version = config_version(config)
    versions.require_supported(version)
    try:
        return _validate(command, env, stdin, config, version)
    except CNIError as err:
        err.cni_version = version  # once known, errors speak the request's version
        raise


def _validate(
    command: str, env: Mapping[str, str], stdin: bytes, config: dict[str, Any], version: str
) -> Request:
    versions.require_verb_allowed(command, version)

    missing = [name for name in REQUIRED_ENV[command] if not env.get(name)]
    if missing:
        raise CNIError(ERR_INVALID_ENV, f"required environment variables {missing} are missing")
    container_id = env.get("CNI_CONTAINERID", "")
    if container_id and not NAME_PATTERN.match(container_id):
        raise CNIError(
            ERR_INVALID_ENV,
            f"invalid CNI_CONTAINERID {container_id!r}: must match [a-zA-Z0-9][a-zA-Z0-9_.-]*",
        )
    ifname = env.get("CNI_IFNAME", "")
    if ifname:
        validate_ifname(ifname)

    network = config.get("name")
    if not network:
        raise CNIError(ERR_INVALID_CONFIG, 'network configuration has no "name"')
    if not isinstance(network, str) or not NAME_PATTERN.match(network):
        raise CNIError(
            ERR_INVALID_CONFIG,
            f"invalid network name {network!r}: must match [a-zA-Z0-9][a-zA-Z0-9_.-]*",
        )

    return Request(
        command=command,
        cni_version=version,
        network=network,
        config=config,
        raw_config=stdin,
        env=env,
        container_id=container_id,
        netns=env.get("CNI_NETNS", ""),
        ifname=ifname,
        args=parse_cni_args(env.get("CNI_ARGS", "")),
    )


def not_text(value: str) -> str | None:
    """Why ``value`` (an environment value, decoded with surrogateescape) cannot be
    kept as text, or None: bytes that are not UTF-8 would fail in the store, the
    logs and the JSON of an answer, far from the variable that brought them."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return "not UTF-8"
    if any(c < " " or c == "\x7f" for c in value):
        return "contains a control character"
    return None


def validate_ifname(ifname: str) -> None:
    problem = not_text(ifname) or ifname_problem(ifname)
    if problem:
        raise CNIError(ERR_INVALID_ENV, f"invalid CNI_IFNAME {ifname!r}: {problem}")


def ifname_problem(ifname: str) -> str | None:
    if len(ifname) > IFNAME_MAX:
        return f"longer than {IFNAME_MAX} characters"
    if ifname in (".", ".."):
        return "not a valid name"
    if any(c in ifname for c in "/:") or any(c.isspace() for c in ifname):
        return "contains '/', ':' or whitespace"
    return None


def parse_cni_args(text: str) -> dict[str, str]:
    """Parse ``K1=V1;K2=V2``; unknown keys are an error unless IgnoreUnknown is set."""
    args: dict[str, str] = {}
    for pair in text.split(";"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CNIError(ERR_INVALID_ENV, f"invalid CNI_ARGS pair {pair!r}: expected KEY=VALUE")
        problem = not_text(pair)
        if problem:
            raise CNIError(ERR_INVALID_ENV, f"invalid CNI_ARGS pair {pair!r}: {problem}")
        args[key] = value
    ignore = args.get("IgnoreUnknown", "false").lower()
    if ignore not in ("1", "true", "0", "false"):
        raise CNIError(
            ERR_INVALID_ENV,
            f"invalid CNI_ARGS IgnoreUnknown={args['IgnoreUnknown']!r}: "
            "expected 1, true, 0 or false",
        )
    unknown = sorted(k for k in args if k not in KNOWN_ARGS)
    if unknown and ignore not in ("1", "true"):
        raise CNIError(
            ERR_INVALID_ENV, f"unknown CNI_ARGS keys {unknown} (set IgnoreUnknown=1 to ignore them)"
        )
    return args


def valid_attachments(config: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The GC request's still-valid (container id, ifname) pairs.

    ``cni.dev/valid-attachments`` (older libcni: ``cni.dev/attachments``);
    absent, null and [] all mean that no attachment is valid.
    """
    raw = config.get("cni.dev/valid-attachments")
    if raw is None:
        raw = config.get("cni.dev/attachments")
    if raw is None:
        return set()
    if not isinstance(raw, list):
        raise CNIError(ERR_DECODE, f'"cni.dev/valid-attachments" must be a list, not {raw!r}')
    valid = set()
    for item in raw:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("containerID"), str)
            and isinstance(item.get("ifname"), str)
        ):
            raise CNIError(
                ERR_DECODE,
                'each of "cni.dev/valid-attachments" needs string '
                f'"containerID" and "ifname", got {item!r}',
            )
        valid.add((item["containerID"], item["ifname"]))
    return valid


def prev_result(request: Request) -> Result | None:
    """The request's prevResult parsed in any version, or None."""
    raw = request.config.get("prevResult")
    if raw is None:
        return None
    return Result.from_json(raw, request.cni_version, where="prevResult")


def requested_mac(request: Request) -> str | None:
    """The pod MAC the runtime asks for (capability ``mac``, or CNI_ARGS ``MAC``)."""
    mac = request.runtime_config("mac") or request.args.get("MAC")
    if mac is None:
        return None
    if not isinstance(mac, str) or not MAC_PATTERN.match(mac):
        raise CNIError(ERR_INVALID_CONFIG, f"invalid MAC address {mac!r} requested")
    return mac.lower()
