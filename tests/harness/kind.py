"""kind clusters from the node image built here, driven through the docker SDK.

``python -m tests.harness.kind`` (the Makefile's ``image``, ``kind-image`` and
``kind-down`` targets; ``make kind`` is tests/harness/daemonset.py's ``up``, which
adds sluice's deployment to what ``up`` here makes):

  image        build the sluice image and its OCI tar
  node-image   build the kind node image (offline; only when an input changed)
  up           a Docker daemon (the project's own when none runs), what is missing
               of the images, ``kind create cluster`` with conf/kind-config.yaml for
               --nodes nodes, the sluice image loaded into every node, the checks
               (every node registered, the static pods and kube-proxy running,
               bpffs and the kernel headers in every node), without sluice;
               prints KUBECONFIG (and DOCKER_HOST)
  load         load an OCI image tar into every node of a cluster
  down         delete the cluster, put back the kernel settings its kubelets turned,
               and stop the project's Docker daemon when it started it
  status       the clusters, their nodes and the daemon

Without sluice the nodes stay NotReady (kind runs with disableDefaultCNI) until
conf/ is applied.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import yaml

from tests.harness import dockerd, host, kind_image, oci_layout, sluice_image
from tests.harness.cache import K8sCache

REPO_ROOT = Path(__file__).resolve().parents[2]
KIND_VERSION = "v0.33.0"
KIND_BIN = REPO_ROOT / ".tools" / "bin" / "kind"
KIND_CONFIG = REPO_ROOT / "conf" / "kind-config.yaml"
RUN_ROOT = Path(os.environ.get("SLUICE_KIND_RUN_DIR") or "/var/lib/sluice-kind")
CLUSTER_LABEL = "io.x-k8s.kind.cluster"
KIND_NETWORK = "kind"
STATIC_PODS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# What the nodes' kubelets may turn for the whole host (a privileged node writes the
# host's kernel-wide settings); per-namespace ones stay inside the nodes.
KERNEL_WIDE_SYSCTLS = (
    *(s for s in host.SYSCTLS if s.startswith(("kernel/", "vm/"))),
    "net/netfilter/nf_conntrack_max",
)


class KindFailed(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[kind] {message}", file=sys.stderr, flush=True)


def run_dir(cluster: str) -> Path:
    return RUN_ROOT / cluster


def kubeconfig_path(cluster: str) -> Path:
    return run_dir(cluster) / "kubeconfig"


# --- tools ------------------------------------------------------------------------------


def kind_binary() -> Path:
    """kind v0.33.0, built from the Go module proxy into .tools/bin when missing."""
    if KIND_BIN.is_file():
        return KIND_BIN
    from tests.harness.build import find_go

    KIND_BIN.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(KIND_BIN.parent), GOFLAGS="-mod=mod")
    proc = subprocess.run(
        [find_go(), "install", f"sigs.k8s.io/kind@{KIND_VERSION}"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise KindFailed(f"go install sigs.k8s.io/kind@{KIND_VERSION} failed:\n{proc.stderr}")
    return KIND_BIN


def kubectl_binary() -> Path:
    return K8sCache.default().binary("kubectl")


def _kind(
    daemon: dockerd.Daemon, *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DOCKER_HOST=daemon.docker_host)
    return subprocess.run(
        [str(kind_binary()), *args], env=env, capture_output=True, text=True,
        check=False, timeout=timeout,
    )  # fmt: skip


def kubectl(cluster: str, *args: str, check: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(
        [str(kubectl_binary()), "--kubeconfig", str(kubeconfig_path(cluster)), *args],
        capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip
    if check and proc.returncode != 0:
        raise KindFailed(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


# --- configuration ----------------------------------------------------------------------


def cluster_config(nodes: int, source: Path = KIND_CONFIG) -> dict[str, object]:
    """conf/kind-config.yaml with one control plane and ``nodes - 1`` workers."""
    if nodes < 1:
        raise ValueError(f"a cluster needs at least one node, not {nodes}")
    config = yaml.safe_load(source.read_text())
    entries = config.get("nodes") or [{"role": "control-plane"}]
    control_plane = next((n for n in entries if n.get("role") == "control-plane"), None)
    worker = next((n for n in entries if n.get("role") == "worker"), None)
    if control_plane is None:
        raise ValueError(f"{source} has no control-plane node to start from")
    worker = worker or {**control_plane, "role": "worker"}
    config["nodes"] = [control_plane, *([worker] * (nodes - 1))]
    return config


# --- the cluster --------------------------------------------------------------------------


def clusters(daemon: dockerd.Daemon) -> list[str]:
    proc = _kind(daemon, "get", "clusters")
    return [line for line in proc.stdout.split() if line and "No kind clusters" not in line]


def node_containers(
    client: docker.DockerClient, cluster: str
) -> list[docker.models.containers.Container]:
    found = client.containers.list(filters={"label": f"{CLUSTER_LABEL}={cluster}"})
    return sorted(found, key=lambda c: c.name)


def _ensure_network(client: docker.DockerClient, daemon: dockerd.Daemon) -> None:
    """On the project's own daemon, kind's network without IPv6: kind would create it
    with an IPv6 range, and Docker then turns on the host's IPv6 forwarding."""
    if not daemon.own or client.networks.list(names=[KIND_NETWORK]):
        return
    client.networks.create(
        KIND_NETWORK,
        driver="bridge",
        options={"com.docker.network.bridge.enable_ip_masquerade": "true"},
    )


def _save_kernel_settings(cluster: str) -> None:
    values = {}
    for name in KERNEL_WIDE_SYSCTLS:
        path = Path("/proc/sys") / name
        if path.exists():
            values[name] = path.read_text().strip()
    (run_dir(cluster) / "host-sysctls.json").write_text(json.dumps(values, indent=1) + "\n")


def _restore_kernel_settings(cluster: str) -> list[str]:
    saved = run_dir(cluster) / "host-sysctls.json"
    if not saved.is_file():
        return []
    done = []
    for name, value in json.loads(saved.read_text()).items():
        path = Path("/proc/sys") / name
        current = path.read_text().strip() if path.exists() else None
        if current is not None and current != value:
            try:
                path.write_text(value)
                done.append(f"sysctl {name}: {current} -> {value}")
            except OSError as err:
                done.append(f"sysctl {name}: could not set {value} back ({err})")
    return done


def create(daemon: dockerd.Daemon, client: docker.DockerClient, cluster: str, nodes: int) -> float:
    """``kind create cluster``; returns the seconds it took."""
    directory = run_dir(cluster)
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / "kind-config.yaml"
    config_file.write_text(yaml.safe_dump(cluster_config(nodes), sort_keys=False))
    _ensure_network(client, daemon)
    if not node_containers(client, cluster):
        _save_kernel_settings(cluster)
    started = time.monotonic()
    proc = _kind(
        daemon, "create", "cluster", "--name", cluster, "--config", str(config_file),
        "--image", kind_image.NODE_IMAGE, "--kubeconfig", str(kubeconfig_path(cluster)),
        "--wait", "0s",
    )  # fmt: skip
    if proc.returncode != 0:
        raise KindFailed(f"kind create cluster {cluster} failed:\n{proc.stderr[-4000:]}")
    seconds = time.monotonic() - started
    log(f"cluster {cluster}: {nodes} node(s) created in {seconds:.0f} s")
    return seconds


def delete(daemon: dockerd.Daemon, cluster: str) -> list[str]:
    done = []
    proc = _kind(daemon, "delete", "cluster", "--name", cluster, "--kubeconfig",
                 str(kubeconfig_path(cluster)))  # fmt: skip
    if proc.returncode != 0:
        raise KindFailed(f"kind delete cluster {cluster} failed:\n{proc.stderr[-2000:]}")
    done.append(f"deleted cluster {cluster}")
    done += _restore_kernel_settings(cluster)
    shutil.rmtree(run_dir(cluster), ignore_errors=True)
    return done


# --- loading an image into the nodes ------------------------------------------------------


def _tar_stream(path: Path, name: str) -> Iterator[bytes]:
    """A tar archive holding ``path`` as ``name``, produced while it is read."""
    info = tarfile.TarInfo(name)
    info.size = path.stat().st_size
    info.mode = 0o644
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk
    padding = -info.size % tarfile.BLOCKSIZE
    yield b"\0" * padding + b"\0" * (2 * tarfile.BLOCKSIZE)


def load(client: docker.DockerClient, cluster: str, oci_tar: Path) -> list[str]:
    """Import an OCI image tar into every node's containerd (namespace k8s.io)."""
    nodes = node_containers(client, cluster)
    if not nodes:
        raise KindFailed(f"cluster {cluster} has no running nodes")
    name, digest = oci_layout.name_and_digest(oci_tar)
    by_digest = f"{oci_layout.repository(name)}@{digest}"
    loaded = []
    for node in nodes:
        inside = f"/var/tmp/{oci_tar.name}"
        if not node.put_archive("/var/tmp", _tar_stream(oci_tar, oci_tar.name)):
            raise KindFailed(f"could not copy {oci_tar} into {node.name}")
        result = node.exec_run(
            ["ctr", "--namespace", "k8s.io", "images", "import", "--digests", inside]
        )
        node.exec_run(["rm", "-f", inside])
        if result.exit_code != 0:
            raise KindFailed(f"ctr images import in {node.name}: {result.output.decode()}")
        # A reference by digest resolves only through an image of that name (what a
        # pull records beside the tag; an import records the tag alone).
        result = node.exec_run(
            ["ctr", "--namespace", "k8s.io", "images", "tag", "--force", name, by_digest]
        )
        if result.exit_code != 0:
            raise KindFailed(f"ctr images tag {by_digest} in {node.name}: {result.output.decode()}")
        loaded.append(node.name)
    log(f"loaded {oci_tar.name} into {', '.join(loaded)}")
    return loaded


def tag(client: docker.DockerClient, cluster: str, source: str, target: str) -> list[str]:
    """Tag an image already loaded into every node's containerd under another name.

    What a rolling update to a new tag pulls, without writing and importing a second
    600 MB OCI tar (about 150 s on this machine): the content is the same.
    """
    nodes = node_containers(client, cluster)
    if not nodes:
        raise KindFailed(f"cluster {cluster} has no running nodes")
    for node in nodes:
        result = node.exec_run(
            ["ctr", "--namespace", "k8s.io", "images", "tag", "--force", source, target]
        )
        if result.exit_code != 0:
            raise KindFailed(
                f"ctr images tag {source} {target} in {node.name}: {result.output.decode()}"
            )
    log(f"tagged {source} as {target} in {', '.join(n.name for n in nodes)}")
    return [n.name for n in nodes]


# --- checks -------------------------------------------------------------------------------


def wait_for(what: str, check, timeout: float = 300.0, interval: float = 2.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except KindFailed as err:
            last = err
        time.sleep(interval)
    raise KindFailed(f"timed out after {timeout:.0f} s waiting for {what} (last: {last})")


def check_cluster(client: docker.DockerClient, cluster: str, nodes: int) -> dict[str, object]:
    """Every node registered, the static pods and kube-proxy running, and in every
    node bpffs mounted and the kernel headers reachable."""

    def registered() -> list[str] | None:
        names = kubectl(cluster, "get", "nodes", "-o", "name").split()
        return names if len(names) == nodes else None

    node_names = wait_for(f"{nodes} registered nodes", registered)

    def control_plane_running() -> dict[str, str] | None:
        pods = json.loads(kubectl(cluster, "get", "pods", "-n", "kube-system", "-o", "json"))
        phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods["items"]}
        static = [n for n in phases if n.startswith(STATIC_PODS)]
        proxies = [n for n in phases if n.startswith("kube-proxy-")]
        running = all(phases[n] == "Running" for n in [*static, *proxies])
        ok = len(static) == len(STATIC_PODS) and len(proxies) == nodes and running
        return phases if ok else None

    phases = wait_for("the static pods and kube-proxy running", control_plane_running)
    for node in node_containers(client, cluster):
        result = node.exec_run(
            [
                "sh",
                "-c",
                "mountpoint -q /sys/fs/bpf && test -e /lib/modules/$(uname -r)/build/include",
            ]
        )
        if result.exit_code != 0:
            raise KindFailed(
                f"{node.name}: bpffs not mounted at /sys/fs/bpf, or no kernel headers under "
                f"/lib/modules/$(uname -r)/build (the host's /usr/src is mounted by kind-config)"
            )
    return {"nodes": node_names, "kube-system": phases}


# --- commands -----------------------------------------------------------------------------


def build_sluice_image(client: docker.DockerClient) -> tuple[sluice_image.Built, Path]:
    built = sluice_image.build(client)
    tar = sluice_image.write_oci_tar(client, built.name, sluice_image.oci_tar_path())
    return built, tar


def up(cluster: str, nodes: int) -> dict[str, object]:
    daemon = dockerd.ensure()
    client = daemon.client()
    node = kind_image.build(client)
    built, tar = build_sluice_image(client)
    created = None
    if cluster in clusters(daemon):
        log(f"cluster {cluster} exists; using it")
    else:
        created = create(daemon, client, cluster, nodes)
    nodes = len(node_containers(client, cluster))
    load(client, cluster, tar)
    checked = check_cluster(client, cluster, nodes)
    return {
        "cluster": cluster,
        "nodes": checked["nodes"],
        "node image": {"name": node.name, "size": node.size, "rebuilt": node.rebuilt},
        "sluice image": built.name,
        "create seconds": created,
        "kubeconfig": str(kubeconfig_path(cluster)),
        "docker host": daemon.docker_host if daemon.own else None,
    }


def down(cluster: str) -> list[str]:
    found = dockerd.running()
    done: list[str] = []
    if found is not None and cluster in clusters(found):
        done += delete(found, cluster)
    if found is not None and found.own:
        client = found.client()
        try:
            if not client.containers.list(all=True, filters={"label": CLUSTER_LABEL}):
                for network in client.networks.list(names=[KIND_NETWORK]):
                    network.remove()
                    done.append(f"removed network {KIND_NETWORK}")
        finally:
            client.close()
    done += dockerd.stop()
    return done


def status() -> dict[str, object]:
    found = dockerd.running()
    if found is None:
        return {"docker": None}
    client = found.client()
    try:
        return {
            "docker": found.docker_host,
            "own daemon": found.own,
            "clusters": {
                name: [c.name for c in node_containers(client, name)] for name in clusters(found)
            },
        }
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.kind",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("image", help="build the sluice image and its OCI tar")
    commands.add_parser("node-image", help="build the kind node image")
    for name in ("up", "down", "load", "status"):
        sub = commands.add_parser(name)
        if name != "status":
            sub.add_argument("--name", default=os.environ.get("KIND_CLUSTER") or "sluice")
        if name == "up":
            sub.add_argument("--nodes", type=int, default=int(os.environ.get("KIND_NODES") or 3))
        if name == "load":
            sub.add_argument("tar", type=Path, help="an OCI image-layout tar")
    args = parser.parse_args(argv)
    try:
        if args.command == "image":
            client = dockerd.ensure().client()
            started = time.monotonic()
            built, tar = build_sluice_image(client)
            overlay = sluice_image.write_deploy_overlay(tar)
            print(f"{built.name}: {built.size / 1e6:.0f} MB, {time.monotonic() - started:.0f} s; "
                  f"OCI tar {tar}")  # fmt: skip
            print(f"pinned: {sluice_image.pinned_reference(tar)}; deploy it with "
                  f"kubectl apply --server-side -k {overlay}")  # fmt: skip
        elif args.command == "node-image":
            client = dockerd.ensure().client()
            node = kind_image.build(client)
            how = f"built in {node.seconds:.0f} s" if node.rebuilt else "up to date"
            print(f"{node.name}: {node.size / 1e6:.0f} MB, {how}")
        elif args.command == "up":
            result = up(args.name, args.nodes)
            print(f"KUBECONFIG={result['kubeconfig']}")
            if result["docker host"]:
                print(f"DOCKER_HOST={result['docker host']}")
            print(
                f"try: {kubectl_binary()} --kubeconfig {result['kubeconfig']} get pods -A -o wide"
            )
        elif args.command == "down":
            for line in down(args.name):
                print(line)
        elif args.command == "load":
            daemon = dockerd.running()
            if daemon is None:
                raise KindFailed("no Docker daemon runs")
            load(daemon.client(), args.name, args.tar)
        elif args.command == "status":
            print(json.dumps(status(), indent=1))
    except (KindFailed, dockerd.DockerUnavailable, sluice_image.BuildFailed) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
