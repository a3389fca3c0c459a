"""The errors of the policy package: bad input, and a policy not computable yet."""

from __future__ import annotations

import json

MISSING = object()  # the value of a required field that is absent


def show(value: object) -> str:
    """A value as the user wrote it: strings quoted, numbers bare, structures as JSON."""
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


class PolicyInputError(ValueError):
    """An object the resolver cannot accept, with the object, the field path and the value.

    ``str(error)`` reads like ``NetworkPolicy x/deny: spec.ingress[0].ports[1].endPort 70
    is lower than port 80``.
    """

    def __init__(self, obj: str, path: str, value: object, problem: str) -> None:
        self.obj = obj
        self.path = path
        self.value = None if value is MISSING else value
        self.problem = problem
        self._given = value
        where = f"{path} " if path else ""
        shown = "" if value is MISSING else f"{show(value)} "
        super().__init__(f"{obj}: {where}{shown}{problem}")

    def within(self, context: str) -> PolicyInputError:
        """The same error, with where the object was found (``document 2``) in front."""
        return PolicyInputError(f"{context}: {self.obj}", self.path, self._given, self.problem)


class PolicyIncomplete(LookupError):
    """A pod's policy cannot be computed yet: the resolver lacks part of its inputs (a
    controller's published objects not all received). Whoever enforces keeps what it has."""
