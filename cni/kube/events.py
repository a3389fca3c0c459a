"""Warning Events on this node's Node object, where ``kubectl describe node`` and
``kubectl get events`` show them (the kubelet's Node events live in ``default``).

Each Event is created once (create only: the ServiceAccount needs no get or patch
on events); a reason that recurs within ``interval`` seconds is counted and told
in the next Event of that reason instead of becoming an Event each time.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from cni.kube.api import Api, ApiError

log = logging.getLogger("sluice.k8s")

NAMESPACE = "default"
COMPONENT = "sluice-agent"
INTERVAL_SECONDS = 60.0


def _timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_object(node: str, node_uid: str, reason: str, message: str, count: int) -> dict[str, Any]:
    now = _timestamp(time.time())
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{node}.{reason.lower()}.{uuid.uuid4().hex[:10]}",
            "namespace": NAMESPACE,
        },
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "count": count,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": f"sluice.dev/{COMPONENT}",
        "reportingInstance": node,
    }


class NodeEvents:
    def __init__(self, api: Api, node: str, interval: float = INTERVAL_SECONDS) -> None:
        self.api = api
        self.node = node
        self.interval = interval
        self._last: dict[str, float] = {}  # reason: when its last Event went out
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, reason: str, message: str, node_uid: str) -> bool:
        """Post a Warning Event (a network call: not on a CNI call's path); False if it
        was only counted, or could not be posted."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self.interval:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
                return False
            self._last[reason] = now
            count = 1 + self._suppressed.pop(reason, 0)
        if count > 1:
            message = f"{message} ({count - 1} more since the last event)"
        obj = event_object(self.node, node_uid, reason, message, count)
        try:
            self.api.create(f"/api/v1/namespaces/{NAMESPACE}/events", obj)
        except ApiError as err:
            log.warning("cannot post the %s event on node %s: %s", reason, self.node, err)
            return False
        return True
