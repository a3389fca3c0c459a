"""The kind node image, built offline: ``localhost/sluice-kind-node:v1.34.4``.

``kind build node-image`` downloads its base image and the release binaries,
so the node is assembled here instead (kind's own build is only ``docker run``,
``ctr import`` and ``docker commit``; kind's source is the reference for what a
node must hold, ``tests/harness/kind_node/`` is the project's own version):

1. the binaries: Kubernetes from the build cache (``make k8s-build``: kubeadm,
   kubelet, kubectl and the control plane), etcd, coredns and crictl from the Go
   module proxy (``kind_components``);
2. the images kubeadm asks for (``kubeadm config images list``): the control
   plane, etcd and coredns as single-binary images, kube-proxy on Debian with
   iptables and nft, the pause image from the cache; each written as an OCI tar;
3. the preload: a throw-away containerd on the host imports them, unpacked
   later by CRI on first use, into a content store that goes into the image's
   ``/var/lib/containerd`` (kind mounts a volume at ``/var``, which Docker fills
   from the image);
4. ``docker build`` of ``kind_node/Dockerfile`` on the Debian 12 base.

The image carries the fingerprint of every input (binaries' stamps, the files,
the Dockerfiles, the base's recipe) as a label, and nothing is redone while it
matches. Everything is cached under ``/var/cache/sluice/kind-v1.34.4``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker

from tests.harness import build as k8s_build
from tests.harness import debian_base, kind_components, sluice_image
from tests.harness.cache import K8S_VERSION, PAUSE_IMAGE, K8sCache
from tests.harness.kind_components import COREDNS_IMAGE, ETCD_IMAGE

NODE_FILES = Path(__file__).resolve().with_name("kind_node")
NODE_IMAGE = f"localhost/sluice-kind-node:{K8S_VERSION}"
# containerd's sandbox image (kind_node/files/etc/containerd/config.toml) and kubeadm's.
PAUSE_ALIAS = "registry.k8s.io/pause:3.10.1"
NODE_BINARIES = ("kubeadm", "kubelet", "kubectl")
CONTAINERD_NAMESPACE = "k8s.io"
# What goes into the image from the preload containerd's root: the rest is its runtime state.
CONTAINERD_KEPT = ("io.containerd.content.v1.content/blobs", "io.containerd.metadata.v1.bolt")


@dataclass(frozen=True)
class StaticImage:
    """An image of static binaries: name in the image -> source, and where they go."""

    programs: dict[str, Path]
    directory: str = "/usr/local/bin"
    entrypoint: tuple[str, ...] = ()
    stamps: tuple[str, ...] = field(default_factory=tuple)


def log(message: str) -> None:
    print(f"[kind-image] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return kind_components.cache_root()


def static_images(cache: K8sCache) -> dict[str, StaticImage]:
    def k8s(name: str) -> StaticImage:
        return StaticImage(
            {name: cache.binary(name)}, stamps=(cache.stamp(cache.binary(name)).read_text(),)
        )

    bins = kind_components.binary
    return {
        f"registry.k8s.io/kube-apiserver:{K8S_VERSION}": k8s("kube-apiserver"),
        f"registry.k8s.io/kube-controller-manager:{K8S_VERSION}": k8s("kube-controller-manager"),
        f"registry.k8s.io/kube-scheduler:{K8S_VERSION}": k8s("kube-scheduler"),
        ETCD_IMAGE: StaticImage(
            {"etcd": bins("etcd"), "etcdctl": bins("etcdctl")},
            stamps=(kind_components.stamp_of("etcd"), kind_components.stamp_of("etcdctl")),
        ),
        # The upstream image runs /coredns; kubeadm's Deployment passes only arguments.
        COREDNS_IMAGE: StaticImage(
            {"coredns": bins("coredns")},
            directory="/",
            entrypoint=("/coredns",),
            stamps=(kind_components.stamp_of("coredns"),),
        ),
    }


KUBE_PROXY_IMAGE = f"registry.k8s.io/kube-proxy:{K8S_VERSION}"
# The files a single-binary image holds besides its binaries (Go's resolver reads nsswitch).
STATIC_ROOTFS = {
    "etc/passwd": (
        "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n"
    ),
    "etc/group": "root:x:0:\nnobody:x:65534:\n",
    "etc/nsswitch.conf": "hosts: files dns\n",
}


def expected_images() -> list[str]:
    """Every image in the node: what kubeadm lists, and the pause image under both names."""
    cache = K8sCache.default()
    return sorted([*static_images(cache), KUBE_PROXY_IMAGE, PAUSE_IMAGE, PAUSE_ALIAS])


def kubeadm_images(cache: K8sCache) -> list[str]:
    proc = subprocess.run(
        [str(cache.binary("kubeadm")), "config", "images", "list",
         "--kubernetes-version", K8S_VERSION],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sorted(proc.stdout.split())


# --- fingerprint ------------------------------------------------------------------------


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(oct(path.stat().st_mode & 0o777).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint(cache: K8sCache) -> str:
    """Changes whenever any input of the node image changes."""
    recipe = {
        "kubernetes": K8S_VERSION,
        "base": debian_base.fingerprint(),
        "node files": _tree_digest(NODE_FILES),
        "node binaries": {n: cache.stamp(cache.binary(n)).read_text() for n in NODE_BINARIES},
        "crictl": kind_components.stamp_of("crictl"),
        "kube-proxy": cache.stamp(cache.binary("kube-proxy")).read_text(),
        "static images": {
            name: [image.directory, image.entrypoint, image.stamps, sorted(image.programs)]
            for name, image in static_images(cache).items()
        },
        "static rootfs": STATIC_ROOTFS,
        "pause": cache.stamp(cache.image_tar(PAUSE_IMAGE)).read_text(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:24]


def current_image(client: docker.DockerClient, cache: K8sCache) -> str | None:
    """The node image's name if it is present and current, else None."""
    if debian_base.image_recipe(client, NODE_IMAGE) == fingerprint(cache):
        return NODE_IMAGE
    return None


# --- the images kubeadm needs -------------------------------------------------------------


def _link_or_copy(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _build_static_image(client: docker.DockerClient, name: str, image: StaticImage) -> None:
    with tempfile.TemporaryDirectory(prefix="static-", dir=cache_root()) as tmp:
        context = Path(tmp)
        for path, text in STATIC_ROOTFS.items():
            (context / "rootfs" / path).parent.mkdir(parents=True, exist_ok=True)
            (context / "rootfs" / path).write_text(text)
        (context / "rootfs" / "tmp").mkdir()
        (context / "rootfs" / "tmp").chmod(0o1777)
        for program, source in image.programs.items():
            _link_or_copy(source, context / "bin" / program)
        lines = [
            "FROM scratch",
            "COPY rootfs/ /",
            f"COPY bin/ {image.directory.rstrip('/')}/",
            "ENV PATH=/usr/local/bin:/usr/bin:/bin",
        ]
        if image.entrypoint:
            lines.append(f"ENTRYPOINT {json.dumps(list(image.entrypoint))}")
        (context / "Dockerfile").write_text("\n".join(lines) + "\n")
        sluice_image.docker_build(
            client,
            context=context,
            dockerfile="Dockerfile",
            tag=name,
            buildargs={},
            log_file=cache_root() / "logs" / f"{_file_name(name)}.log",
        )


def _build_kube_proxy(client: docker.DockerClient, cache: K8sCache, base: str) -> None:
    with tempfile.TemporaryDirectory(prefix="kube-proxy-", dir=cache_root()) as tmp:
        context = Path(tmp)
        shutil.copy2(NODE_FILES / "images" / "kube-proxy.Dockerfile", context / "Dockerfile")
        shutil.copy2(NODE_FILES / "images" / "iptables-wrapper", context / "iptables-wrapper")
        _link_or_copy(cache.binary("kube-proxy"), context / "bin" / "kube-proxy")
        sluice_image.docker_build(
            client,
            context=context,
            dockerfile="Dockerfile",
            tag=KUBE_PROXY_IMAGE,
            buildargs={"BASE": base},
            log_file=cache_root() / "logs" / "kube-proxy.log",
        )


def _file_name(image: str) -> str:
    return image.replace("/", "_").replace(":", "_")


def image_tars(client: docker.DockerClient, cache: K8sCache, base: str) -> list[Path]:
    """OCI tars of every image the node preloads (built through Docker's layer cache)."""
    tars_dir = cache_root() / "images"
    tars = []
    for name, image in static_images(cache).items():
        _build_static_image(client, name, image)
        tars.append(sluice_image.write_oci_tar(client, name, tars_dir / f"{_file_name(name)}.tar"))
    _build_kube_proxy(client, cache, base)
    tars.append(
        sluice_image.write_oci_tar(
            client, KUBE_PROXY_IMAGE, tars_dir / f"{_file_name(KUBE_PROXY_IMAGE)}.tar"
        )
    )
    tars.append(cache.image_tar(PAUSE_IMAGE))
    return tars


# --- the preload ------------------------------------------------------------------------


@contextlib.contextmanager
def preload_containerd(workdir: Path) -> Iterator[Path]:
    """A containerd with only its content, image and metadata services; yields its socket."""
    root, state, sock = workdir / "root", workdir / "state", workdir / "containerd.sock"
    config = workdir / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{root}"\nstate = "{state}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",'
        ' "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",'
        ' "io.containerd.snapshotter.v1.aufs"]\n'
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n'
    )
    log_file = (workdir / "containerd.log").open("wb")
    proc = subprocess.Popen(
        ["containerd", "--config", str(config)], stdout=log_file, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not _ctr_answers(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the preload containerd did not start (see {workdir / 'containerd.log'}):\n"
                    + (workdir / "containerd.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()


def _ctr(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(sock), "--namespace", CONTAINERD_NAMESPACE, *args],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def _ctr_answers(sock: Path) -> bool:
    return sock.exists() and _ctr(sock, "version").returncode == 0


def preload(tars: list[Path], dest: Path) -> list[str]:
    """Import ``tars`` (without unpacking) into a content store written to ``dest``."""
    with tempfile.TemporaryDirectory(prefix="preload-", dir=cache_root()) as tmp:
        with preload_containerd(Path(tmp)) as sock:
            for tar in tars:
                proc = _ctr(sock, "images", "import", "--no-unpack", str(tar))
                if proc.returncode != 0:
                    raise RuntimeError(f"ctr images import {tar} failed: {proc.stderr.strip()}")
            proc = _ctr(sock, "images", "tag", "--force", PAUSE_IMAGE, PAUSE_ALIAS)
            if proc.returncode != 0:
                raise RuntimeError(f"ctr images tag {PAUSE_IMAGE}: {proc.stderr.strip()}")
            names = sorted(_ctr(sock, "images", "list", "--quiet").stdout.split())
        shutil.rmtree(dest, ignore_errors=True)
        for kept in CONTAINERD_KEPT:
            shutil.copytree(Path(tmp) / "root" / kept, dest / kept)
    return names


# --- the node image -----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeImage:
    name: str
    image_id: str
    size: int
    seconds: float
    rebuilt: bool


def build(client: docker.DockerClient) -> NodeImage:
    """The node image, current: built only when an input changed."""
    started = time.monotonic()
    cache = k8s_build.build()  # a no-op when current; kubeadm is in its recipe
    kind_components.build()
    wanted = fingerprint(cache)
    if current_image(client, cache):
        image = client.images.get(NODE_IMAGE)
        return NodeImage(NODE_IMAGE, image.id, int(image.attrs["Size"]), 0.0, rebuilt=False)
    listed = kubeadm_images(cache)
    missing = sorted(set(listed) - set(expected_images()))
    if missing:
        raise RuntimeError(f"kubeadm {K8S_VERSION} asks for images the node lacks: {missing}")
    base = debian_base.ensure_image(client)
    tars = image_tars(client, cache, base)
    context = cache_root() / "context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    names = preload(tars, context / "containerd")
    if sorted(set(names)) != expected_images():
        raise RuntimeError(f"the preload holds {names}, expected {expected_images()}")
    shutil.copy2(NODE_FILES / "Dockerfile", context / "Dockerfile")
    shutil.copytree(NODE_FILES / "files", context / "files", symlinks=True)
    for name in NODE_BINARIES:
        _link_or_copy(cache.binary(name), context / "bin" / name)
    _link_or_copy(kind_components.binary("crictl"), context / "bin" / "crictl")
    image_id = sluice_image.docker_build(
        client,
        context=context,
        dockerfile="Dockerfile",
        tag=NODE_IMAGE,
        buildargs={"BASE": base, "KUBERNETES_VERSION": K8S_VERSION},
        labels={debian_base.FINGERPRINT_LABEL: wanted},
        log_file=cache_root() / "logs" / "node-image.log",
    )
    shutil.rmtree(context, ignore_errors=True)
    image = client.images.get(image_id)
    seconds = time.monotonic() - started
    log(f"{NODE_IMAGE} ({image_id[:19]}): {image.attrs['Size'] / 1e6:.0f} MB in {seconds:.0f} s")
    return NodeImage(NODE_IMAGE, image_id, int(image.attrs["Size"]), seconds, rebuilt=True)
