"""The agent's Prometheus metrics (``sluicectl agent --metrics-address HOST:PORT``).

Latencies are observed as they happen (CNI calls by verb and outcome; policy
compute and install); everything else is read when Prometheus scrapes: the
IPAM's numbers (as ``sluicectl ipam show`` computes them), the datapath's map
fill, its pool of conntrack tables, its per-direction verdict counters, and
the RCU grace periods the agent's threads waited for (CNI requests should
wait for none: the reaper and the enforcer's batches do).

A scrape must cost the CNI path nothing it notices (the agent's threads share
one interpreter): the output is rendered at most once a second whatever
the number of scrapers (``metrics_http``); the IPAM's numbers are read through
an allocator the agent holds open and idle, never by opening the store (when
none is idle the last numbers stand); conntrack tables are counted a chunk of
entries per system call, at most once per ``CT_REFRESH`` seconds.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cni.datapath import ctpool, rcu
from cni.datapath.maps import Datapath, TableFill
from cni.plugin.ipam_client import KeptAllocators
from cni.plugin.netconf import NetConf
from cni.plugin.release import VERSION

log = logging.getLogger("sluice.agent")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
CT_REFRESH = 30.0  # seconds between two counts of the conntrack tables


class Metrics:
    def __init__(
        self, conf: NetConf, datapath: Datapath, allocators: KeptAllocators | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        self.build = Info(
            "sluice_build",
            "The agent's release and Python, and the network it serves (always 1).",
            registry=self.registry,
        )
        self.build.info(
            {"version": VERSION, "python": platform.python_version(), "network": conf.network}
        )
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        self.process = ProcessCollector(registry=self.registry)
        self.cni = Histogram(
            "sluice_cni_duration_seconds",
            "CNI calls served by the agent, by verb and outcome.",
            ["verb", "result"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.policy = Histogram(
            "sluice_policy_duration_seconds",
            "Policy work per endpoint: compute (resolve) and install (compile and switch).",
            ["step"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._scraped = _Scraped(conf, datapath, allocators or KeptAllocators())
        self.registry.register(self._scraped)
        self.refused = Gauge(
            "sluice_policies_refused",
            "NetworkPolicies the API server accepted that sluice cannot read whole: they "
            "isolate what they select, what cannot be read allows nothing "
            "(`sluicectl get policies` says why).",
            registry=self.registry,
        )
        self.drift = Counter(
            "sluice_policy_drift",
            "Differences between the live datapath and a computation from scratch that the "
            "periodic verification found twice in a row and repaired, by kind (resolver, "
            "datapath, addresses, services).",
            ["kind"],
            registry=self.registry,
        )
        self._server: Any = None

    def count_drift(self, kind: str, count: int) -> None:
        self.drift.labels(kind).inc(count)

    def name_pods(self, pods: Callable[[], dict[int, tuple[str, str]]]) -> None:
        """Where the pod of each endpoint (by ifindex) is read at each scrape."""
        self._scraped.pods = pods

    def count_refused(self, count: Callable[[], int]) -> None:
        """Where the number of refused policies is read at each scrape."""
        self.refused.set_function(count)

    def cni_call(self, verb: str, rc: int, seconds: float) -> None:
        self.cni.labels(verb or "-", "ok" if rc == 0 else "error").observe(seconds)

    def observe(self, step: str, seconds: float) -> None:
        self.policy.labels(step).observe(seconds)

    def serve(self, address: str, readiness: Callable[[], tuple[bool, str]]) -> None:
        """/metrics, /healthz and /readyz on ``address`` (cni/agent/metrics_http.py)."""
        from cni.agent import metrics_http

        self._server = metrics_http.serve(address, self.registry, readiness)
        log.info("metrics on http://%s/metrics (and /healthz, /readyz)", address)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class _Scraped(Collector):
    """Numbers read at scrape time."""

    def __init__(self, conf: NetConf, datapath: Datapath, allocators: KeptAllocators) -> None:
        self.conf = conf
        self.datapath = datapath
        self.allocators = allocators
        # {ifindex: (namespace, pod)} of the node's endpoints (the enforcer's, once set)
        self.pods: Callable[[], dict[int, tuple[str, str]]] = dict
        self._ipam_stats: dict[str, Any] | None = None  # the last numbers read
        self._tables: list[TableFill] = []
        self._tables_read = -CT_REFRESH  # monotonic time of the last count
        self._tables_lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        yield from self._ipam()
        yield from self._datapath()

    def _ipam(self) -> Iterator[Any]:
        from cni.plugin.netconf import DelegatedIPAM

        if isinstance(self.conf.ipam, DelegatedIPAM):
            return
        from ipam.errors import IPAMError
        from ipam.report import network_report

        try:
            with self.allocators.idle(self.conf.ipam) as allocator:
                if allocator is not None:
                    self._ipam_stats = network_report(allocator)["stats"]
        except IPAMError as err:
            log.warning("metrics: cannot read the IPAM store: %s", err)
        stats = self._ipam_stats
        if stats is None:
            return  # no allocator opened yet (no CNI call since the start)
        network = self.conf.network
        for name, help_text, value in (
            ("allocated_addresses", "Addresses allocated.", stats["allocated"]),
            ("free_addresses", "Addresses neither allocated nor cooling.", stats["free"]),
            ("free_aligned_blocks", "Free aligned blocks.", stats["freeAlignedBlocks"]),
            (
                "packing_ratio",
                "Prefixes held / prefixes needed (prefix mode).",
                stats["packing"],
            ),
            ("held_prefixes", "Prefixes held (prefix mode).", stats["prefixesHeld"]),
        ):
            if value is None:
                continue
            gauge = GaugeMetricFamily(f"sluice_ipam_{name}", help_text, labels=["network"])
            gauge.add_metric([network], value)
            yield gauge
        largest = stats["largestFreeBlock"]
        gauge = GaugeMetricFamily(
            "sluice_ipam_largest_free_block_addresses",
            "Addresses in the largest free aligned block.",
            labels=["network"],
        )
        gauge.add_metric([network], 2 ** (32 - int(largest.split("/")[1])) if largest else 0)
        yield gauge

    def _datapath(self) -> Iterator[Any]:
        try:
            counters = self.datapath.counters()
            endpoints = len(self.datapath.endpoints.all())
        except Exception as err:  # the datapath may be reloading
            log.warning("metrics: cannot read the datapath: %s", err)
            return
        packets = CounterMetricFamily(
            "sluice_datapath_packets",
            "Packets judged by the datapath, by direction (of the pod) and verdict or drop reason.",
            labels=["direction", "verdict"],
        )
        for direction, reasons in counters.items():
            for reason, count in reasons.items():
                packets.add_metric([direction, reason], count)
        yield packets
        fill = GaugeMetricFamily(
            "sluice_datapath_map_entries", "Entries in the datapath's maps.", labels=["map"]
        )
        fill.add_metric(["endpoints"], endpoints)
        fill.add_metric(["service_ips"], len(self.datapath.network.service_ips()))
        fill.add_metric(["policies"], len(self.datapath.policies.ids()))
        fill.add_metric(["ct_tables"], len(self.datapath.inner_maps("ct_tables")))
        yield fill
        pool = GaugeMetricFamily(
            "sluice_conntrack_pool_tables",
            "Conntrack tables not in use: free (empty, ready for an ADD) or dirty (given back).",
            labels=["state"],
        )
        pool.add_metric(["free"], len(ctpool.free_tables(self.datapath)))
        pool.add_metric(["dirty"], len(ctpool.dirty_tables(self.datapath)))
        yield pool
        waits = CounterMetricFamily(
            "sluice_rcu_waits",
            "RCU grace periods the agent waited for (writes of maps of maps), by thread: "
            "reaper, enforcer, or requests (CNI calls and sluicectl's).",
            labels=["thread"],
        )
        by_role: dict[str, int] = {"reaper": 0, "enforcer": 0, "requests": 0}
        for thread, count in rcu.waits_by_thread().items():
            role = next((r for r in ("reaper", "enforcer") if thread.startswith(r)), "requests")
            by_role[role] += count
        for role, count in by_role.items():
            waits.add_metric([role], count)
        yield waits
        # One series per pod of the node (bounded by the endpoints map): the tables of
        # endpoints no pod is known for (yet) are summed under empty labels.
        labels = ["namespace", "pod"]
        entries = GaugeMetricFamily(
            "sluice_conntrack_entries",
            "Live entries in a pod's conntrack tables.",
            labels=labels,
        )
        capacity = GaugeMetricFamily(
            "sluice_conntrack_capacity_entries",
            "Size of a pod's conntrack tables.",
            labels=labels,
        )
        evicted = CounterMetricFamily(
            "sluice_conntrack_evicted_entries",
            "Entries a pod's full conntrack tables evicted.",
            labels=labels,
        )
        pods = self.pods()
        sums: dict[tuple[str, str], list[int]] = {}
        for table in self._table_fills():
            pod = pods.get(table.ifindex, ("", ""))
            total = sums.setdefault(pod, [0, 0, 0])
            total[0] += table.entries
            total[1] += table.capacity
            total[2] += table.evicted
        for pod, (live, size, gone) in sorted(sums.items()):
            entries.add_metric(list(pod), live)
            capacity.add_metric(list(pod), size)
            evicted.add_metric(list(pod), gone)
        yield entries
        yield capacity
        yield evicted

    def _table_fills(self) -> list[TableFill]:
        """Every endpoint's conntrack table, counted at most once per CT_REFRESH."""
        with self._tables_lock:
            if time.monotonic() - self._tables_read >= CT_REFRESH:
                fills = (self.datapath.conntrack.fill(i) for i in self.datapath.conntrack.tables())
                self._tables = [fill for fill in fills if fill is not None]
                self._tables_read = time.monotonic()
            return self._tables
