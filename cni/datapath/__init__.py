"""The eBPF datapath: programs on each pod's node-side veth whose maps hold the verdicts.

Modules:

- the kernel's interfaces: ``bpf`` (the bpf(2) system call, no bcc: pins and
  maps), ``bpf_programs`` (program info, BPF_PROG_TEST_RUN), ``bpf_links``
  (tcx and netfilter links), ``btf`` (kernel struct layouts), ``rcu`` (grace
  periods: waiting for one, counting who waited);
- what the C programs share: ``vocabulary`` (directions and reasons, as
  bpf/vocabulary.h has them), ``structs`` (mirrors of bpf/sluice.h),
  ``settings`` (the plugin config's "datapath" object);
- the pinned maps: ``maps`` (the handle: lock, ledger, config, counters),
  ``endpoint_maps``, ``policy_maps``, ``conntrack_maps``, ``network_maps`` (one
  class per map family), ``lock`` (the one lock on bpfDir), ``readback``;
- programs on devices: ``loader`` (compiles with bcc and pins, once per node),
  ``attach`` (programs on a device's hooks), ``endpoint`` (per-pod
  register/attach/detach, sweeps), ``endpoint_check``, ``uplink``,
  ``after_nat`` (netfilter's hooks), ``program_switch`` (after a reload);
- policy: ``ruleset`` (a direction's rules compiled, and their digest),
  ``policy_registry`` (rule sets shared by content: policy ids),
  ``policy_install`` (installing endpoints' policies, in batches),
  ``policy_writer`` and ``interfaces`` (the enforcer's view of it);
- upkeep: ``ctpool`` (empty conntrack tables ready for ADD), ``reaper``
  (garbage of the maps of maps, off the CNI path), ``events`` (the deny ring
  buffer).
"""
