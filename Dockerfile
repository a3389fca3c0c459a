# The one sluice image: the node agent, the policy controller and the installer
# (`sluicectl agent|controller|install ...`). Debian 12, its Python and its bcc
# (python3-bpfcc); the kernel headers bcc compiles against are the host's,
# mounted at run time (/lib/modules and /usr/src), never baked in.
#
#   make image                  # offline: a Debian base made here with debootstrap,
#                               # version and tag from cni/plugin/release.py, plus an OCI tar
#   docker build --build-arg VERSION=0.1.0 -t sluice:0.1.0 .   # with Docker Hub's Debian
#
# Classic builder syntax only (DOCKER_BUILDKIT=0 works): no --mount, no heredocs.

ARG BASE=debian:bookworm-slim
FROM ${BASE}

# libnftables1: the masquerade rules (loaded with ctypes, and copied by
# `install --runtime` for nodes without Python); iproute2 for looking around.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-bpfcc libnftables1 nftables iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# The venv sees Debian's bcc (--system-site-packages) and takes the rest from
# PyPI. Dependencies (and the build backend, so that installing the project
# needs no download) first, in their own layer: a source change rebuilds only
# the layers below.
ENV VIRTUAL_ENV=/opt/sluice/venv
ENV PATH=/opt/sluice/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# BUILD_CA_CERTS (PEM text, optional) is trusted for these downloads only, for
# sites whose HTTPS goes through a proxy with a CA of its own; it is not kept.
COPY pyproject.toml /src/pyproject.toml
ARG BUILD_CA_CERTS=""
RUN python3 -m venv --system-site-packages "$VIRTUAL_ENV" \
 && python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"] + ["wheel"]))' > /src/requirements.txt \
 && if [ -n "$BUILD_CA_CERTS" ]; then \
      cat /etc/ssl/certs/ca-certificates.crt > /tmp/build-ca.pem \
      && printf '%s\n' "$BUILD_CA_CERTS" >> /tmp/build-ca.pem \
      && export PIP_CERT=/tmp/build-ca.pem; \
    fi \
 && pip install --no-cache-dir --disable-pip-version-check -r /src/requirements.txt \
 && rm -f /tmp/build-ca.pem

COPY README.md /src/README.md
COPY cni /src/cni
COPY ipam /src/ipam
COPY bpf /src/bpf
# The datapath's C sources sit next to the packages, where the loader and the
# runtime copy look for them. The build fails if the installed version is not
# the one the image is labelled with.
ARG VERSION
RUN test -n "$VERSION" || { echo "build with --build-arg VERSION=<cni/plugin/release.py's VERSION>" >&2; exit 1; } \
 && pip install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation /src \
 && site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cp -r /src/bpf "$site/bpf" \
 && rm -rf /src \
 && test "$(sluicectl --version)" = "sluicectl $VERSION" \
 && python3 -c 'import bcc, pyroute2, cni.agent.daemon'

LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="A Kubernetes CNI plugin: veth wiring, crash-safe IPAM and eBPF NetworkPolicy" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

ENTRYPOINT ["sluicectl"]
CMD ["--help"]
