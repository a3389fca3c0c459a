"""Kubernetes: the API (``api``), collections kept in step (``informer``), the
agent's policy source (``source``), and the cluster-wide resolver that writes
PolicyEndpoints (``controller``, ``endpoints``)."""
