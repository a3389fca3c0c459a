"""NetworkPolicy resolution: Kubernetes objects in, each local pod's EndpointPolicy out.

Pure Python (no kernel, no root, no network). Modules, one concern each:

- ``model``: the objects, cut down to the fields the resolver reads;
- ``fields``, ``parse``, ``parse_policy``: API JSON / manifest dicts into the model,
  validated like the API server;
- ``manifest``: multi-document YAML or JSON files of those objects;
- ``selectors``: label selector matching and what a policy peer means;
- ``store``, ``groups``: the objects, and each distinct selector's pods kept up to date;
- ``rules``: one policy's rules as datapath allow rules;
- ``resolve``: what a resolver answers, and how a pod's policies combine;
- ``index``: ``PolicyIndex``, the resolver state the agent feeds and asks;
- ``explain``: what a pod may receive and send, and the verdict for one flow.

Where Kubernetes leaves room, sluice chooses:

- named ports: ingress uses the target pod's own container port of that name
  and protocol; egress uses each peer pod's, one allow rule per distinct
  resolved port set. Towards an ipBlock (or with no ``to``), a name is looked
  up on the pods whose addresses fall inside the block (any pod); addresses
  that are no pod's have no named ports, so the name allows nothing there.
  A name that resolves to nothing allows nothing.
- hostNetwork pods are never policy targets; as peers they are their
  addresses (the node's), like any other address.
- pods without an address, and pods in phase Succeeded or Failed (whose
  address may already be another pod's), are no peers.
- a pod always reaches itself: each isolated direction allows its own
  addresses first.
- a namespace with pods but no Namespace object has only the
  ``kubernetes.io/metadata.name`` label.
- the datapath is IPv4: IPv6 addresses and ipBlocks are left out of the
  rules, and a rule left with no peer allows nothing (never "any peer").
- Services are not turned into rules: connections to a ClusterIP are judged
  after kube-proxy's DNAT, on the backend pod; ``resolve.service_ips`` lists
  the ClusterIPs for the datapath.

``PolicyIndex`` is not thread-safe: the agent serialises its calls.
"""
