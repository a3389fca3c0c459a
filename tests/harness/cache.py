"""Where the built Kubernetes lives: binaries, image tars and their stamps.

The cache sits outside the repository (default ``/var/cache/sluice/k8s-v1.34.4``,
``SLUICE_K8S_CACHE`` overrides it) so that it survives ``git clean`` and is shared by
every checkout on the machine. A file counts as built only when its stamp holds the
fingerprint of the recipe that produced it; a half-written file never has one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = "v1.34.4"
# Kubernetes publishes its staging modules (k8s.io/api, k8s.io/client-go, ...) as v0.Y.Z.
STAGING_VERSION = "v0" + K8S_VERSION[K8S_VERSION.index(".") :]

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
AGNHOST_IMAGE = "registry.k8s.io/e2e-test-images/agnhost:2.56"

# Binary name -> Go package. All are built in one `go build`, with cgo off.
COMMANDS = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "kubeadm": "k8s.io/kubernetes/cmd/kubeadm",  # for the kind node image
    "agnhost": "k8s.io/kubernetes/test/images/agnhost",
}
# Binary name -> Go package whose test binary it is (`go test -c`).
TEST_BINARIES = {"e2e.test": "k8s.io/kubernetes/test/e2e"}

IMAGE_TARS = {PAUSE_IMAGE: "pause-3.10.tar", AGNHOST_IMAGE: "agnhost-2.56.tar"}

CACHE_ENV = "SLUICE_K8S_CACHE"
DEFAULT_CACHE = Path("/var/cache/sluice") / f"k8s-{K8S_VERSION}"


@dataclass(frozen=True)
class K8sCache:
    """The cache directory's layout."""

    root: Path

    @classmethod
    def default(cls) -> K8sCache:
        return cls(Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE))

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    @property
    def stamps_dir(self) -> Path:
        return self.root / "stamps"

    @property
    def module_dir(self) -> Path:
        """The scratch Go module that requires k8s.io/kubernetes."""
        return self.root / "module"

    @property
    def lock_file(self) -> Path:
        return self.root / "build.lock"

    @property
    def timings_file(self) -> Path:
        return self.root / "build-timings.json"

    def binary(self, name: str) -> Path:
        if name not in COMMANDS and name not in TEST_BINARIES:
            raise KeyError(f"{name!r} is not a binary this cache builds")
        return self.bin_dir / name

    def image_tar(self, image: str) -> Path:
        return self.images_dir / IMAGE_TARS[image]

    def stamp(self, path: Path) -> Path:
        return self.stamps_dir / f"{path.name}.stamp"

    def is_current(self, path: Path, fingerprint: str) -> bool:
        stamp = self.stamp(path)
        return path.is_file() and stamp.is_file() and stamp.read_text() == fingerprint

    def mark_built(self, path: Path, fingerprint: str) -> None:
        self.stamps_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.stamp(path).with_suffix(".part")
        tmp.write_text(fingerprint)
        tmp.replace(self.stamp(path))

    def missing(self) -> list[Path]:
        """Everything a cluster needs that has no stamp yet (any fingerprint)."""
        wanted = [self.binary(n) for n in (*COMMANDS, *TEST_BINARIES)]
        wanted += [self.image_tar(i) for i in IMAGE_TARS]
        return [p for p in wanted if not (p.is_file() and self.stamp(p).is_file())]
