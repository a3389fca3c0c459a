"""The CNI network under test, driven by a real containerd 1.6.

Two CNI clients are exercised: ``ctr run --cni`` (go-cni, fixed system paths) and the
CRI plugin via ``crictl runp`` (the same calls a kubelet makes for a pod). The network
itself comes from the ``containerd_network`` fixture.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from tempfile import mkdtemp

import pytest

from tests.harness.cni_run import TEST_BPF_DIR, Network
from tests.harness.containerd import (
    ADDRESS_RE,
    CRI_NAMESPACE,
    CniNetwork,
    CtrRun,
    PrivateContainerd,
    addresses_in_netns,
    cni_cache_entries,
    find_crictl,
    host_links_with_address_in,
    pick_unused_subnet,
    pod_netns_path,
    unique_id,
    write_pod_config,
)
from tests.harness.oci_image import build_busybox_image

VENV_BIN = Path(__file__).resolve().parents[3] / ".venv" / "bin"
IMAGE_REF = "localhost/sluice-test/busybox:1"
DEBIAN_CNI = Path("/usr/lib/cni")
# Prints the address the CNI plugin gave eth0, then idles as PID 1.
PRINT_ADDR_THEN_SLEEP = ["sh", "-c", "ip -4 -o addr show eth0; exec sleep 3600"]


class SluiceNetwork(CniNetwork):
    """sluice, installed by ``sluicectl install``, with sluice-ipam in node-CIDR mode.

    ctr only searches /opt/cni/bin and /usr/lib/cni, so the launchers are also
    linked into /opt/cni/bin for it (``system_plugins``); the CRI plugin uses
    ``bin_dir``, which also needs loopback.
    """

    def __init__(self) -> None:
        workdir = Path(mkdtemp(prefix="sluice-net-"))
        subnet = pick_unused_subnet()
        name = unique_id("slt-ctrd")
        self.state_dir = workdir / "state"
        conflist = {
            # containerd 1.6's libcni knows result versions up to 1.0.0.
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {
                    "type": "sluice",
                    "policy": "off",
                    "stateDir": str(self.state_dir),
                    "bpfDir": TEST_BPF_DIR,
                    "ipam": {"type": "sluice-ipam", "subnet": str(subnet)},
                }
            ],
        }
        super().__init__(name, conflist, workdir, subnet)
        subprocess.run(
            [
                VENV_BIN / "sluicectl",
                "install",
                "--bin-dir",
                self.bin_dir,
                "--conf-dir",
                workdir / "unused-conf",
            ],
            check=True,
            capture_output=True,
        )
        self.system_plugins = (self.bin_dir / "sluice", self.bin_dir / "sluice-ipam")
        self.link_plugins(DEBIAN_CNI / p for p in ("loopback", "portmap"))
        self.store = Network(name, str(subnet), self.state_dir, self.bin_dir)

    def assert_released(self) -> None:
        assert self.store.allocations() == {}, f"sluice-ipam still holds {self.store.allocations()}"
        assert self.store.veths() == [], f"veths left: {self.store.veths()}"
        assert self.store.masqueraded() == set()
        leaked = host_links_with_address_in(self.subnet)
        assert leaked == [], f"host links still carry {self.subnet} addresses: {leaked}"

    def assert_pod_args(self, namespace: str, name: str) -> None:
        """The runtime's K8S_POD_* CNI_ARGS reached the IPAM store with the allocation."""
        db = self.state_dir / "ipam" / f"{self.name}.db"
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT pod_namespace, pod_name FROM allocations").fetchall()
        assert (namespace, name) in rows, rows

    def close(self) -> None:
        self.store.cleanup()
        super().close()


# --- fixtures ----------------------------------------------------------------------


@pytest.fixture
def containerd_network() -> Iterator[CniNetwork]:
    """The network configuration under test; the one place to switch plugins."""
    network = SluiceNetwork()
    try:
        yield network
    finally:
        network.close()


@pytest.fixture(scope="session")
def busybox_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_busybox_image(tmp_path_factory.mktemp("oci") / "busybox.tar", IMAGE_REF)


@pytest.fixture
def containerd(containerd_network: CniNetwork, busybox_image: Path) -> Iterator[PrivateContainerd]:
    daemon = PrivateContainerd(
        cni_bin_dir=containerd_network.bin_dir,
        cni_conf_dir=containerd_network.conf_dir,
        sandbox_image=IMAGE_REF,
    )
    with daemon:
        for namespace in ("default", CRI_NAMESPACE):
            imported = daemon.import_image(busybox_image, namespace)
            assert imported == IMAGE_REF, f"image imported as {imported!r}"
        yield daemon


@pytest.fixture
def ctr_cni(
    containerd: PrivateContainerd, containerd_network: CniNetwork
) -> Iterator[PrivateContainerd]:
    """containerd plus the network installed where ``ctr run --cni`` looks for it."""
    containerd_network.install_system()
    try:
        yield containerd
    finally:
        # ctr must see its tasks exit (and send DEL) while the plugins are in place.
        containerd.stop_runs()
        containerd_network.uninstall_system()


# --- tests -------------------------------------------------------------------------


def _container_ip(run: CtrRun, subnet: ipaddress.IPv4Network) -> str:
    ip = run.wait_for(ADDRESS_RE)["ip"]
    assert ipaddress.ip_address(ip) in subnet, f"{run.container_id} got {ip}, not in {subnet}"
    return ip


@pytest.mark.containerd
def test_ctr_run_cni_two_containers_ping(
    ctr_cni: PrivateContainerd, containerd_network: CniNetwork
) -> None:
    subnet = containerd_network.subnet
    first = ctr_cni.run_cni_container(IMAGE_REF, unique_id("ctr"), PRINT_ADDR_THEN_SLEEP)
    second = ctr_cni.run_cni_container(IMAGE_REF, unique_id("ctr"), PRINT_ADDR_THEN_SLEEP)
    first_ip, second_ip = _container_ip(first, subnet), _container_ip(second, subnet)
    assert first_ip != second_ip

    ids = [first.cni_container_id, second.cni_container_id]
    assert all(cni_cache_entries([i]) for i in ids), "libcni cached no ADD result"

    ping = ctr_cni.exec_in(second, "ping", "-c", "1", "-W", "5", first_ip, check=False)
    output = ping.stdout + ping.stderr
    assert ping.returncode == 0, f"ping {first_ip} from {second_ip} failed:\n{output}"

    for run in (first, second):
        ctr_cni.stop_run(run)
        assert run.proc.returncode is not None, f"ctr run {run.container_id} did not finish"
    left = set(ctr_cni.container_ids()) & {first.container_id, second.container_id}
    assert not left, f"ctr run --rm left containers behind: {left}"
    # libcni drops its cached result only after a successful DEL.
    assert cni_cache_entries(ids) == [], "CNI DEL did not run for every container"
    containerd_network.assert_released()


@pytest.mark.containerd
def test_crictl_runp(containerd: PrivateContainerd, containerd_network: CniNetwork) -> None:
    if find_crictl() is None:
        if shutil.which("go"):
            pytest.fail("crictl is missing although Go is installed: run `make tools`")
        pytest.skip("crictl is not installed and there is no Go to build it")
    containerd.wait_cri_ready(image=IMAGE_REF)
    name, namespace = unique_id("pod"), unique_id("ns")
    pod_config = write_pod_config(
        containerd.scratch, name=name, namespace=namespace, cgroup_parent=containerd.cgroup_parent
    )

    pod_id = containerd.run_pod(pod_config)
    try:
        inspect = containerd.crictl_json("inspectp", pod_id)
        ip = inspect["status"]["network"]["ip"]
        assert ip, f"pod has no IP: {json.dumps(inspect['status'], indent=1)}"
        assert ipaddress.ip_address(ip) in containerd_network.subnet
        assert addresses_in_netns(pod_netns_path(inspect)) == [ip]
        containerd_network.assert_pod_args(namespace, name)
        assert cni_cache_entries([pod_id]), "libcni cached no ADD result"
    finally:
        containerd.remove_pod(pod_id)

    assert cni_cache_entries([pod_id]) == [], "CNI DEL did not run for the pod"
    containerd_network.assert_released()
