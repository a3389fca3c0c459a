"""What can go wrong in address management.

The IPAM package raises only these; whoever serves a protocol (the CNI plugin,
``sluice-ipam``, sluicectl) maps them to its own error codes.
"""

from __future__ import annotations


class IPAMError(Exception):
    """Base of every IPAM failure; the message names what failed and with which value."""


class InvalidConfig(IPAMError):
    """The ``ipam`` configuration is invalid."""


class Unsupported(IPAMError):
    """The configuration asks for something this IPAM does not do (yet), such as IPv6."""


class NoAddress(IPAMError):
    """Nothing is left to hand out."""


class StoreError(IPAMError):
    """The store cannot be opened, locked, read or written."""


class ClaimsUnavailable(IPAMError):
    """Prefix claims live where this process cannot reach them now (the Kubernetes API,
    reached only through the agent); the call may succeed later."""
