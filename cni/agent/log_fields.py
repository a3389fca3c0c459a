"""Fields every log line of a CNI call carries: the verb, the container and the pod.

The agent serves each call in a thread of its own; ``for_call`` sets the call's
fields for that thread's context (a ``ContextVar``), and the JSON formatter
(``cni.agent.daemon.JSONLines``) adds them to every line logged meanwhile, so
``jq 'select(.pod == "web-0")'`` finds everything one pod's ADD logged. The
fields come from the call's environment as sent, read without judging it:
a malformed CNI_ARGS yields what can be read, never an error (the verb reports
that), and each value is cut to ``MAX_VALUE`` characters.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

MAX_VALUE = 253  # a DNS subdomain, the longest name Kubernetes gives a pod

_CALL: ContextVar[dict[str, str] | None] = ContextVar("sluice_call_fields", default=None)


def fields_of(env: Mapping[str, str]) -> dict[str, str]:
    """The log fields of a CNI call's environment (empty values left out)."""
    args = {}
    for pair in env.get("CNI_ARGS", "").split(";"):
        key, _, value = pair.partition("=")
        args[key.strip()] = value.strip()
    found = {
        "verb": env.get("CNI_COMMAND", ""),
        "container_id": env.get("CNI_CONTAINERID", ""),
        "namespace": args.get("K8S_POD_NAMESPACE", ""),
        "pod": args.get("K8S_POD_NAME", ""),
    }
    return {key: value[:MAX_VALUE] for key, value in found.items() if value}


@contextlib.contextmanager
def for_call(env: Mapping[str, str]) -> Iterator[None]:
    token = _CALL.set(fields_of(env))
    try:
        yield
    finally:
        _CALL.reset(token)


def current() -> dict[str, str]:
    """The fields of the call being served in this context (none outside a call)."""
    return _CALL.get() or {}


def error_of(stdout: str) -> str:
    """A failed call's error JSON as one line: "code N (msg): details"."""
    try:
        error = json.loads(stdout)
        return f"code {error['code']} ({error['msg']}): {error.get('details', '')}"
    except (ValueError, TypeError, KeyError):
        return stdout.strip()[:500] or "no output"
