"""The two images a cluster needs, as OCI tars in the cache (no registry is reachable).

* ``registry.k8s.io/pause:3.10``: the sandbox image containerd starts for every pod;
  a busybox layer whose command sleeps forever.
* ``registry.k8s.io/e2e-test-images/agnhost:2.56``: the busybox layer plus the static
  ``/agnhost`` built from Kubernetes' source, with the upstream image's entrypoint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.harness import oci_image
from tests.harness.cache import AGNHOST_IMAGE, PAUSE_IMAGE, K8sCache

PAUSE_CMD = ("/bin/sleep", "2147483647")
AGNHOST_ENTRYPOINT = ("/agnhost",)
AGNHOST_CMD = ("pause",)


def _fingerprint(image: str, inputs: list[str]) -> str:
    return hashlib.sha256("\n".join([image, *inputs]).encode()).hexdigest()


def _file_identity(path: Path) -> str:
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def build_images(cache: K8sCache) -> bool:
    """Write both image tars unless current; True if anything was (re)built."""
    agnhost = cache.binary("agnhost")
    if not agnhost.is_file():
        raise FileNotFoundError(f"{agnhost} is missing: build the binaries first")
    busybox = _file_identity(oci_image.BUSYBOX)
    recipes = {
        PAUSE_IMAGE: (_fingerprint(PAUSE_IMAGE, [busybox, *PAUSE_CMD]), {}, None, PAUSE_CMD),
        AGNHOST_IMAGE: (
            _fingerprint(AGNHOST_IMAGE, [busybox, cache.stamp(agnhost).read_text()]),
            {"/agnhost": agnhost},
            AGNHOST_ENTRYPOINT,
            AGNHOST_CMD,
        ),
    }
    built = False
    for image, (fingerprint, extra_files, entrypoint, cmd) in recipes.items():
        tar = cache.image_tar(image)
        if cache.is_current(tar, fingerprint):
            continue
        tar.unlink(missing_ok=True)  # build_busybox_image keeps an existing tar
        oci_image.build_busybox_image(
            tar, image, extra_files=extra_files, entrypoint=entrypoint, cmd=cmd
        )
        cache.mark_built(tar, fingerprint)
        built = True
    return built
