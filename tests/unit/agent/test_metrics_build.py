"""The agent's metrics say which release runs and what its process costs."""

from __future__ import annotations

import platform
from pathlib import Path

from cni.agent.metrics import Metrics
from cni.datapath.maps import Datapath
from cni.plugin import netconf
from cni.plugin.release import VERSION


def test_build_info_and_process_metrics(tmp_path: Path) -> None:
    ipam = {"type": "sluice-ipam", "subnet": "10.99.0.0/24", "dataDir": str(tmp_path / "ipam")}
    conf = netconf.parse(
        {"cniVersion": "1.1.0", "name": "metrics-net", "type": "sluice", "ipam": ipam}
    )
    with Datapath(str(tmp_path)) as datapath:  # nothing pinned: only these two are read
        metrics = Metrics(conf, datapath)
        build = {s.name: s for family in metrics.build.collect() for s in family.samples}
        info = build["sluice_build_info"]
        assert info.value == 1
        assert info.labels == {
            "version": VERSION, "python": platform.python_version(), "network": "metrics-net"
        }  # fmt: skip
        process = {s.name for family in metrics.process.collect() for s in family.samples}
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= process
