#!/bin/sh
# Prepare a Debian 12 machine for `make kind`: Debian's Docker (docker.io),
# debootstrap, make, Python, and Go >= 1.24 (Kubernetes 1.34's go line; Debian 12
# ships 1.19). `make kind` runs it first (make kind-deps), and the Vagrantfile
# provisions its VM with it and `--make-kind`, so the VM takes the path tested here.
#
#   sh tests/harness/kind-host.sh               # the packages and Go, when missing
#   sh tests/harness/kind-host.sh --make-kind   # then `make kind` in SLUICE_REPO [/vagrant]
set -eu

GO_VERSION=${SLUICE_GO_VERSION:-1.25.5}
GO_MINIMUM_MINOR=24
PACKAGES="docker.io debootstrap make python3 python3-venv ca-certificates curl"

say() { echo "kind-host: $*" >&2; }

missing=""
for package in $PACKAGES; do
  dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q 'ok installed' \
    || missing="$missing $package"
done
if [ -n "$missing" ]; then
  say "installing$missing"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi

go_minor() {
  "$1" env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p'
}
go=$(command -v go || true)
[ -n "$go" ] || [ ! -x /usr/local/go/bin/go ] || go=/usr/local/go/bin/go
if [ -z "$go" ] || [ "$(go_minor "$go")" -lt "$GO_MINIMUM_MINOR" ]; then
  # Debian 12 has no Go this new: the release from go.dev, checked against the
  # digest go.dev publishes for it.
  archive="go$GO_VERSION.linux-amd64.tar.gz"
  say "installing Go $GO_VERSION into /usr/local/go"
  curl -fsSL -o "/tmp/$archive" "https://go.dev/dl/$archive"
  digest=$(curl -fsSL "https://go.dev/dl/?mode=json&include=all" \
    | python3 -c 'import json, sys; print(next(f["sha256"] for r in json.load(sys.stdin) for f in r["files"] if f["filename"] == sys.argv[1]))' "$archive")
  echo "$digest  /tmp/$archive" | sha256sum -c -
  rm -rf /usr/local/go
  tar -C /usr/local -xzf "/tmp/$archive"
  rm -f "/tmp/$archive"
  ln -sf /usr/local/go/bin/go /usr/local/bin/go
fi

if [ "${1:-}" = "--make-kind" ]; then
  repo=${SLUICE_REPO:-/vagrant}
  say "make kind in $repo"
  PATH="/usr/local/go/bin:$PATH" make -C "$repo" kind
fi
