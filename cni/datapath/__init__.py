"""The eBPF datapath: programs on each pod's node-side veth whose maps hold the verdicts.

Modules: ``vocabulary`` (directions and reasons, as bpf/vocabulary.h has them),
``structs`` (mirrors of bpf/sluice.h), ``bpf`` (the bpf(2) system call, no
bcc; BPF_PROG_TEST_RUN too), ``settings`` (the plugin config's "datapath"
object), ``lock`` (the one lock on bpfDir), ``maps`` (the pinned maps,
per-endpoint conntrack tables, the ClusterIP set), ``loader`` (compiles with
bcc and pins, once per node), ``endpoint`` (per-pod attach/detach/check,
sweeps, uplinks), ``policy`` (atomic rule sets), ``events`` (the deny ring
buffer).
"""
