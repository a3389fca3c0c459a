# sluice: `make demo` and `make test` set up everything they need on a fresh
# Debian 12 machine (run as root) and are safe to run again.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := .tools/bin
KVER := $(shell uname -r)

DEB_PACKAGES := containerd runc containernetworking-plugins busybox-static \
	python3-venv python3-bpfcc bpfcc-tools clang linux-headers-amd64 \
	iperf3 iputils-ping iproute2 nftables iptables procps

.PHONY: test demo setup deps headers bpffs venv tools lint bench clean

test: setup lint k8s-build
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(PY) demo/run.py

bench: setup k8s-build
	$(PY) bench/add_del.py
	$(PY) bench/ipam_churn.py
	$(PY) bench/del_conntrack.py
	$(PY) bench/policy_apply.py
	$(PY) bench/policy_resolve.py
	$(PY) bench/datapath.py
	$(PY) bench/k8s_scale.py --modes controller
	# Agent-local resolution holds every pod in each agent: ten fit a 2-CPU machine.
	$(PY) bench/k8s_scale.py --modes agent --agents 10 --workers 1 --changes 20

lint: venv
	$(PY) -m ruff check cni ipam tests bench demo
	$(PY) -m ruff format --check cni ipam tests bench demo
	$(PY) -m mypy

setup: deps headers bpffs venv tools

# The datapath pins its programs and maps in the BPF filesystem; some VMs boot
# without it mounted.
bpffs:
	@mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

# Debian packages, installed only when one is missing.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

# bcc compiles against the running kernel's headers. When the kernel has no
# module tree (as in many VMs), point it at Debian's header packages:
# `build` is the arch tree, `source` the matching -common tree (kconfig.h).
headers: deps
	@if [ ! -e /lib/modules/$(KVER)/build ]; then \
		hdr=$$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -n1); \
		common=$${hdr%-amd64}-common; \
		mkdir -p /lib/modules/$(KVER); \
		ln -sfn $$hdr /lib/modules/$(KVER)/build; \
		ln -sfn $$common /lib/modules/$(KVER)/source; \
		echo "kernel headers: $$hdr"; \
	fi

# The venv uses Debian's python3 so that it also sees Debian's bcc module.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@[ -x $(PY) ] || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Real CNI clients for the tests, from the Go module proxy. Where Go is
# installed a failed build fails the setup (the tests that need the clients
# would fail too); only a machine without Go goes without them.
tools: $(TOOLS)/cnitool $(TOOLS)/crictl
$(TOOLS)/cnitool:
	@mkdir -p $(TOOLS)
	@if command -v go >/dev/null; then \
		GOBIN=$(CURDIR)/$(TOOLS) GOFLAGS=-mod=mod \
			go install github.com/containernetworking/cni/cnitool@v1.3.1; \
	else echo "no Go: cnitool not built"; fi
$(TOOLS)/crictl:
	@mkdir -p $(TOOLS)
	@if command -v go >/dev/null; then \
		GOBIN=$(CURDIR)/$(TOOLS) GOFLAGS=-mod=mod \
			go install sigs.k8s.io/cri-tools/cmd/crictl@v1.37.0; \
	else echo "no Go: crictl not built"; fi

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache *.egg-info

# --- A real Kubernetes: build cache, single-node cluster, NetworkPolicy e2e --------
# Kubernetes v1.34.4 is built from the Go module proxy once into a cache outside the
# repository (SLUICE_K8S_CACHE, default /var/cache/sluice/k8s-v1.34.4); the tests in
# tests/node/agent/test_kubernetes.py and `make e2e` run a single-node cluster from it with
# sluice as the only CNI. `python -m tests.harness up|down|status` drives it by hand.
DEB_PACKAGES += etcd-server conntrack openssl

.PHONY: k8s-build e2e

k8s-build: deps venv
	$(PY) -m tests.harness build

# Up, Kubernetes' `[sig-network] Netpol` specs (SCTP connectivity skipped), down, tally.
# E2E_ARGS passes options through, e.g. E2E_ARGS="--focus 'allow-all'".
e2e: setup k8s-build
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m tests.harness e2e $(if $(NODES),--nodes $(NODES)) $(E2E_ARGS)

# Random sequences of policy, pod, namespace and label changes on a single-node cluster,
# every pod pair probed after each step and compared with an oracle written from the
# NetworkPolicy specification (tests/harness/policy_fuzz.py), for FUZZ_SECONDS in each
# resolver mode; a failure prints its shrunk sequence as a replay command.
FUZZ_SECONDS ?= 600
.PHONY: policy-fuzz
policy-fuzz: setup k8s-build
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m tests.harness.policy_fuzz run \
		--seconds $(FUZZ_SECONDS) --resolver agent $(FUZZ_ARGS)
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m tests.harness.policy_fuzz run \
		--seconds $(FUZZ_SECONDS) --resolver controller $(FUZZ_ARGS)

# --- The sluice image and kind ------------------------------------------------------
# The sluice image (Dockerfile) and a kind node image are built offline on a Debian
# 12 base made with debootstrap; a Docker daemon of the project's own starts when
# none runs (tests/harness/dockerd.py). `make kind` leaves a cluster running and
# prints its KUBECONFIG; `make kind-down` deletes it and stops that daemon again.
# docs/kind.md has the details.
DEB_PACKAGES += docker.io debootstrap vagrant
KIND_NODES ?= 3
KIND_CLUSTER ?= sluice
KIND_ROUTING ?= native
KIND := $(PY) -m tests.harness.kind

.PHONY: image kind-deps kind-image kind kind-e2e kind-down kind-status kind-test

tools: $(TOOLS)/kind
$(TOOLS)/kind:
	@mkdir -p $(TOOLS)
	@if command -v go >/dev/null; then \
		GOBIN=$(CURDIR)/$(TOOLS) GOFLAGS=-mod=mod go install sigs.k8s.io/kind@v0.33.0; \
	else echo "no Go: kind not built"; fi

# Docker, debootstrap and Go when missing: the script the Vagrantfile provisions with.
kind-deps:
	@sh tests/harness/kind-host.sh

image: setup kind-deps
	$(KIND) image

kind-image: setup kind-deps k8s-build
	$(KIND) node-image

# The cluster with sluice deployed from conf/ (tests/harness/daemonset.py): the sluice
# and agnhost images loaded into every node, every node Ready, sluice and CoreDNS ready.
# KIND_ROUTING=vxlan sets SLUICE_ROUTING (the pods' traffic between nodes in the tunnel).
kind: kind-image image
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m tests.harness.daemonset up \
		--name $(KIND_CLUSTER) --nodes $(KIND_NODES) --routing $(KIND_ROUTING)

# On the cluster of `make kind` (made first when missing): the network-model checks
# and the egress sequences of the policy matrix (tests/node/kind), then the whole [sig-network] Netpol e2e suite; KIND_E2E_REPORT
# keeps its JUnit report and log.
KIND_E2E_REPORT ?= /var/lib/sluice-kind/$(KIND_CLUSTER)-e2e
kind-e2e: kind
	KIND_CLUSTER=$(KIND_CLUSTER) KIND_ROUTING=$(KIND_ROUTING) PATH="$(CURDIR)/$(TOOLS):$$PATH" \
		$(PY) -m pytest -m kind tests/node/kind $(PYTEST_ARGS)
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m tests.harness.daemonset e2e \
		--name $(KIND_CLUSTER) --report-dir $(KIND_E2E_REPORT)

kind-down: venv
	$(KIND) down --name $(KIND_CLUSTER)

kind-status: venv
	$(KIND) status

# The node image booted as kind boots it, and a cluster created, checked and deleted
# (not part of `make test`: minutes of both CPUs).
kind-test: kind-image
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m pytest -m kind tests/node/images $(PYTEST_ARGS)
