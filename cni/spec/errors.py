"""CNI error codes and the exception that carries them to the caller.

Libraries raise :class:`CNIError` (the IPAM package raises its own errors,
mapped by :func:`from_ipam`); only the entry points turn it into the error
JSON on stdout (spec section "Error").
"""

from __future__ import annotations

# Codes fixed by the CNI specification.
ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENV = 4
ERR_IO = 5
ERR_DECODE = 6
ERR_INVALID_CONFIG = 7
ERR_TRY_AGAIN = 11
ERR_NOT_AVAILABLE = 50
ERR_LIMITED_CONNECTIVITY = 51

# sluice's own codes (100 and up are plugin-specific).
ERR_KERNEL = 100  # a netlink, sysctl or nftables operation failed
ERR_CHECK_FAILED = 101  # CHECK found state missing or different from prevResult
ERR_NO_ADDRESS = 102  # the address pool has nothing left to hand out
ERR_STORE = 103  # the IPAM store cannot be read or written
ERR_DELEGATE = 104  # a delegated plugin could not be run or answered garbage
ERR_INTERNAL = 999  # a bug: an exception nobody expected

MESSAGES = {
    ERR_INCOMPATIBLE_VERSION: "incompatible CNI version",
    ERR_UNSUPPORTED_FIELD: "unsupported field in network configuration",
    ERR_UNKNOWN_CONTAINER: "container unknown or does not exist",
    ERR_INVALID_ENV: "invalid environment variables",
    ERR_IO: "I/O failure",
    ERR_DECODE: "failed to decode content",
    ERR_INVALID_CONFIG: "invalid network configuration",
    ERR_TRY_AGAIN: "try again later",
    ERR_NOT_AVAILABLE: "plugin not available",
    ERR_LIMITED_CONNECTIVITY: "plugin not available, existing containers may have limited "
    "connectivity",
    ERR_KERNEL: "kernel operation failed",
    ERR_CHECK_FAILED: "check failed",
    ERR_NO_ADDRESS: "no address available",
    ERR_STORE: "IPAM store unusable",
    ERR_DELEGATE: "delegated plugin failed",
    ERR_INTERNAL: "internal error",
}


class CNIError(Exception):
    """An error with a CNI code; ``details`` says what failed and with which value."""

    def __init__(self, code: int, details: str, msg: str | None = None) -> None:
        super().__init__(details)
        self.code = code
        self.msg = msg or MESSAGES.get(code, "error")
        self.details = details
        self.cni_version: str | None = None  # the request's, when it was known

    def to_json(self, cni_version: str) -> dict[str, object]:
        return {
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        }

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg


def from_ipam(err: Exception) -> CNIError:
    """The CNI error for an IPAM failure (``ipam.errors``)."""
    from ipam import errors

    codes: dict[type[Exception], int] = {
        errors.InvalidConfig: ERR_INVALID_CONFIG,
        errors.Unsupported: ERR_UNSUPPORTED_FIELD,
        errors.NoAddress: ERR_NO_ADDRESS,
        errors.StoreError: ERR_STORE,
        errors.ClaimsUnavailable: ERR_TRY_AGAIN,  # the agent (and its API client) comes back
    }
    return CNIError(codes.get(type(err), ERR_INTERNAL), str(err))
