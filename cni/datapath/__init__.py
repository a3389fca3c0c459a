"""The eBPF datapath: programs on each pod's node-side veth whose maps hold the verdicts.

Modules: ``bpf`` (the bpf(2) system call, no bcc), ``structs`` (mirrors of
bpf/sluice.h), ``maps`` (the pinned maps), ``loader`` (compiles with bcc and
pins, once per node), ``endpoint`` (per-pod attach/detach), ``policy``
(atomic rule sets), ``events`` (the deny ring buffer).
"""
