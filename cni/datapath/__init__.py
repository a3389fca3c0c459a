"""The eBPF datapath: programs on each pod's node-side veth whose maps hold the verdicts.

Modules: ``vocabulary`` (directions and reasons, as bpf/vocabulary.h has them),
``structs`` (mirrors of bpf/sluice.h), ``bpf`` (the bpf(2) system call, no
bcc; BPF_PROG_TEST_RUN too), ``rcu`` (grace periods: waiting for one,
counting who waited), ``settings`` (the plugin config's "datapath" object),
``lock`` (the one lock on bpfDir), ``maps`` (the pinned maps, the ClusterIP
set, the ledger of ids), ``loader`` (compiles with bcc and pins, once per
node), ``endpoint`` (per-pod attach/detach/check, sweeps, uplinks),
``ctpool`` (empty conntrack tables ready for ADD), ``ruleset`` (a direction's
rules compiled, and their digest), ``policies`` (rule sets shared by
content: policy ids), ``policy`` (installing endpoints' policies, in
batches), ``reaper`` (garbage of the maps of maps, off the CNI path),
``events`` (the deny ring buffer).
"""
