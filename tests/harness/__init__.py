"""A real single-node Kubernetes for sluice's tests.

``python -m tests.harness build`` builds Kubernetes from the Go module proxy into a cache
outside the repository (``cache``, ``build``, ``images``); ``python -m tests.harness up``
starts etcd, the control plane, a private containerd, the kubelet and kube-proxy with
sluice as the only CNI (``cluster``); ``python -m tests.harness e2e`` runs Kubernetes' own
NetworkPolicy e2e suite against it (``e2e``). ``fixtures`` holds the pytest fixtures.
"""
