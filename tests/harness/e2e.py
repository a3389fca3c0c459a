"""Run Kubernetes' own e2e specs (``e2e.test`` from the cache) against a ``Cluster``.

``run_netpol`` runs the ``[sig-network] Netpol`` suite, without the specs that need
SCTP traffic (this kernel has no SCTP), and returns a ``Tally`` read from the JUnit
report. Specs that focus and skip filtered out are not counted; a selected spec the
suite skipped itself is.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.cluster import Cluster
from tests.harness.multinode import MultiNodeCluster

NETPOL_FOCUS = r"\[sig-network\] Netpol"
# The three specs that send SCTP (this kernel has none). The two that only install
# SCTP policies and probe with TCP ("... even if the plugin doesn't support SCTP") run.
NETPOL_SKIP = r"\[Feature:SCTPConnectivity\]"
ALLOW_ALL_SPEC = "should support allow-all policy"
# A fast subset of the suite (``make test`` runs it; ``make e2e`` runs them all).
NETPOL_SUBSET = (
    "should support allow-all policy",
    "should support a 'default-deny-ingress' policy",
    "should allow ingress access on one named port",
    "should enforce policy to allow traffic only from a different namespace, based on "
    "NamespaceSelector",
    "should allow egress access to server in CIDR block",
)
NETPOL_SUBSET_FOCUS = (
    r"\[sig-network\] Netpol NetworkPolicy between server and client ("
    + "|".join(re.escape(spec) for spec in NETPOL_SUBSET)
    + ")"
)
NETPOL_SUBSET_SKIP = rf"{NETPOL_SKIP}|using UDP|using SCTP"
# Ginkgo stops a suite after 1 h by default. Without enforcement every Netpol spec
# waits out its probes' retries (about 2 min each), so the whole suite needs more.
SUITE_TIMEOUT = "4h"
SUITE_TIMEOUT_MARK = "Suite Timeout Elapsed"


@dataclass
class Tally:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exit_code: int = 0
    report_dir: Path | None = None
    timed_out: bool = False  # the suite timeout stopped it; "skipped" then includes unrun specs

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.failed) + len(self.skipped)

    def summary(self) -> str:
        lines = [
            f"{self.total} specs: {len(self.passed)} passed, {len(self.failed)} failed, "
            f"{len(self.skipped)} skipped in {self.seconds:.0f} s (e2e.test exit {self.exit_code})"
        ]
        if self.timed_out:
            lines.append("  the suite timeout stopped the run: skipped specs include unrun ones")
        for label, names in (("PASSED", self.passed), ("FAILED", self.failed)):
            lines += [f"  {label} {name}" for name in names]
        if self.report_dir is not None:
            lines.append(f"  report and log: {self.report_dir}")
        return "\n".join(lines)


def run_e2e(
    cluster: Cluster | MultiNodeCluster,
    *,
    focus: str,
    skip: str = "",
    report_dir: Path | None = None,
    extra_args: Sequence[str] = (),
    suite_timeout: str = SUITE_TIMEOUT,
    echo: bool = False,
) -> Tally:
    """Run ``e2e.test`` with ``focus``/``skip`` and tally its JUnit report.

    ``suite_timeout`` (a Go duration) bounds the whole run; ginkgo then stops and
    still writes its report.
    """
    report_dir = report_dir or Path(tempfile.mkdtemp(prefix="sluice-e2e-"))
    report_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(cluster.cache.binary("e2e.test")),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--kubectl-path={cluster.cache.binary('kubectl')}",
        "--provider=skeleton",
        "--e2e-verify-service-account=false",
        f"--report-dir={report_dir}",
        f"--ginkgo.focus={focus}",
        "--ginkgo.no-color",
        "--ginkgo.silence-skips",
        f"--ginkgo.timeout={suite_timeout}",
        *([f"--ginkgo.skip={skip}"] if skip else []),
        *extra_args,
    ]
    log_path = report_dir / "e2e.log"
    started = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=report_dir,  # e2e.test may write files next to itself
        )
        assert proc.stdout is not None
        timed_out = False
        for line in proc.stdout:
            log.write(line)
            timed_out = timed_out or SUITE_TIMEOUT_MARK in line
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
        exit_code = proc.wait()
    tally = tally_junit(report_dir, focus, skip)
    tally.seconds = time.monotonic() - started
    tally.exit_code = exit_code
    tally.report_dir = report_dir
    tally.timed_out = timed_out
    if tally.total == 0:
        raise RuntimeError(
            f"e2e.test ran no spec (exit {exit_code}); tail of {log_path}:\n"
            + "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        )
    return tally


def run_netpol(
    cluster: Cluster | MultiNodeCluster,
    focus: str = NETPOL_FOCUS,
    skip: str = NETPOL_SKIP,
    report_dir: Path | None = None,
    echo: bool = False,
) -> Tally:
    """Kubernetes' NetworkPolicy conformance suite (or the part ``focus`` selects)."""
    return run_e2e(cluster, focus=focus, skip=skip, report_dir=report_dir, echo=echo)


def tally_junit(report_dir: Path, focus: str, skip: str) -> Tally:
    reports = sorted(report_dir.glob("junit*.xml"))
    tally = Tally()
    if not reports:
        return tally
    focus_re = re.compile(focus)
    skip_re = re.compile(skip) if skip else None
    for case in ET.parse(reports[-1]).getroot().iter("testcase"):
        name = case.get("name", "")
        if not focus_re.search(name) or (skip_re is not None and skip_re.search(name)):
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            tally.failed.append(name)
        elif case.find("skipped") is not None:
            tally.skipped.append(name)
        else:
            tally.passed.append(name)
    return tally
