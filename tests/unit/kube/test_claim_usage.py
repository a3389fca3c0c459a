"""What a node reports about its claims: usage in the claims' status, shortages as
Events, both collected on the CNI path and sent by the store's rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from cni.kube import prefixclaims
from cni.kube.api import ApiError
from cni.kube.claimcache import ClaimCache
from cni.kube.claimusage import UsageReporter
from ipam.claims import BlockUsage, Shortage
from tests.unit.kube.claim_fakes import FakeApi, Net, claim_obj, config

BLOCK = Net("10.40.0.16/28")


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def warning(self, reason: str, message: str, node_uid: str) -> bool:
        self.posted.append((reason, message, node_uid))
        return True


class Reporting:
    def __init__(self, tmp_path: Path, events: Events | None = None) -> None:
        self.api = FakeApi()
        self.api.add(claim_obj(str(BLOCK)))
        self.cache = ClaimCache(config(tmp_path))
        self.cache.replace("prefixclaims", list(self.api.claims.values()))
        self.woken = 0
        self.reporter = UsageReporter(
            self.api,  # type: ignore[arg-type]
            self.cache,
            events,  # type: ignore[arg-type]
            lambda: "node-uid",
            self.wake,
        )

    def wake(self) -> None:
        self.woken += 1

    def status_patches(self) -> int:
        return sum(path.endswith("/status") for _, path in self.api.requests)


def test_usage_goes_out_once_per_change_and_into_the_cache(tmp_path: Path) -> None:
    r = Reporting(tmp_path)
    r.reporter.report_usage({BLOCK: BlockUsage(3, ())})
    r.reporter.report_usage({BLOCK: BlockUsage(5, ())})  # before the round: one patch
    assert r.woken == 2 and r.status_patches() == 0
    r.reporter.flush()
    assert r.status_patches() == 1
    assert r.api.claims[prefixclaims.name_of(BLOCK)]["status"]["used"] == 5
    assert [c.used for c in r.cache.claims()] == [5]
    r.reporter.report_usage({BLOCK: BlockUsage(5, ())})  # published already
    r.reporter.flush()
    assert r.woken == 2 and r.status_patches() == 1


def test_usage_of_a_claim_gone_is_dropped(tmp_path: Path) -> None:
    r = Reporting(tmp_path)
    r.api.claims.clear()
    r.reporter.report_usage({BLOCK: BlockUsage(3, ())})
    r.reporter.flush()
    r.reporter.flush()
    assert r.status_patches() == 1


def test_usage_that_failed_to_go_out_goes_in_the_next_round(tmp_path: Path) -> None:
    r = Reporting(tmp_path)
    r.reporter.report_usage({BLOCK: BlockUsage(3, ())})
    r.api.fail["PATCH"] = ApiError(503, "unavailable")
    with pytest.raises(ApiError):
        r.reporter.flush()
    r.reporter.flush()
    assert r.status_patches() == 2
    assert r.api.claims[prefixclaims.name_of(BLOCK)]["status"]["used"] == 3


def shortage(reason: str) -> Shortage:
    return Shortage(reason, f"the pool is {reason}", 0, None)


def test_the_latest_shortage_goes_out_as_an_event(tmp_path: Path) -> None:
    events = Events()
    r = Reporting(tmp_path, events)
    r.reporter.no_free_block("node-a", shortage("fragmented"))
    r.reporter.no_free_block("node-a", shortage("exhausted"))
    assert r.woken == 2 and r.reporter.shortages == {"fragmented": 1, "exhausted": 1}
    r.reporter.report_shortage()
    r.reporter.report_shortage()
    assert events.posted == [("PrefixPoolExhausted", "the pool is exhausted", "node-uid")]


def test_without_events_a_shortage_is_only_counted(tmp_path: Path) -> None:
    r = Reporting(tmp_path)
    r.reporter.no_free_block("node-a", shortage("exhausted"))
    r.reporter.report_shortage()
    assert r.reporter.shortages == {"exhausted": 1} and r.api.requests == []
