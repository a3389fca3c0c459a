"""NetworkPolicy resolution: Kubernetes objects in, each local pod's EndpointPolicy out.

Pure Python (no kernel, no root, no network). Modules, one concern each:

- ``model``: the objects, cut down to the fields the resolver reads;
- ``parse``: API JSON / manifest dicts into the model, validated like the API server;
- ``manifest``: multi-document YAML or JSON files of those objects;
- ``selectors``: label selector matching and what a policy peer means;
- ``store``, ``groups``: the objects, and each distinct selector's pods kept up to date;
- ``rules``: one policy's rules as datapath allow rules;
- ``resolve``: ``PolicyIndex``, the resolver state the agent feeds and asks;
- ``explain``: what a pod may receive and send, and the verdict for one flow.
"""
