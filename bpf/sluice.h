/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Structures and constants shared by the datapath programs and by
 * userspace (cni/datapath/structs.py mirrors every struct here; a test
 * checks sizes and field offsets). Addresses and ports are in network byte
 * order, everything else in host order. Structs are padded explicitly so
 * that C and Python agree without relying on compiler padding.
 */
#ifndef __SLUICE_H__
#define __SLUICE_H__

#include <linux/types.h>

/* Directions, from the pod's point of view. */
#define SL_DIR_EGRESS	0	/* from the pod: clsact ingress of the node-side veth */
#define SL_DIR_INGRESS	1	/* to the pod: clsact egress of the node-side veth */
#define SL_DIRS		2

/* Endpoint flags. */
#define SL_EP_ISOLATED_EGRESS	(1 << 0)	/* egress policy applies: deny unless allowed */
#define SL_EP_ISOLATED_INGRESS	(1 << 1)	/* ingress policy applies */
#define SL_EP_DENY_NODE		(1 << 2)	/* do not exempt traffic from the node */

/* One pod's host-side veth, keyed by its ifindex. */
struct sl_endpoint {
	__be32 ip;		/* the pod's address: anything else from the pod is spoofed */
	__u32 policy_gen;	/* generation whose policy maps are live */
	__u32 flags;		/* SL_EP_* */
	__u32 pad;
};

/* Outer key of the per-endpoint policy maps: one inner map per generation
 * and direction, so a whole new rule set becomes live with the one write
 * that moves sl_endpoint.policy_gen.
 */
struct sl_policy_key {
	__u32 ifindex;
	__u32 gen;
	__u32 dir;
};

/* Inner LPM: peer prefix -> peer set. A peer set is the set of rule peers
 * that contain an address (userspace merges nested prefixes and "except").
 */
struct sl_peer_key {
	__u32 prefixlen;
	__be32 addr;
};

struct sl_peer {
	__u32 set;
};

/* Inner rule hash: (peer set, protocol, destination port) -> allow.
 * port 0 holds the entry for "any port" and for port ranges; proto 0 means
 * any protocol (and then port must be 0).
 */
struct sl_rule_key {
	__u32 set;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

#define SL_MAX_RANGES	8
#define SL_RULE_ANY_PORT	(1 << 0)

struct sl_port_range {
	__u16 first;		/* host order, inclusive */
	__u16 last;
};

struct sl_rule {
	__u32 flags;		/* SL_RULE_ANY_PORT */
	__u32 nranges;		/* used entries of ranges[] */
	struct sl_port_range ranges[SL_MAX_RANGES];
};

/* Conntrack, one entry per flow and endpoint, keyed in the direction of the
 * flow's first packet. Replies match the reversed key.
 */
struct sl_ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;		/* ICMP echo: the identifier */
	__be16 dport;
	__u32 ifindex;
	__u8 proto;
	__u8 pad[3];
};

#define SL_CT_SEEN_REPLY	(1 << 0)
#define SL_CT_FIN_ORIG		(1 << 1)
#define SL_CT_FIN_REPLY		(1 << 2)
#define SL_CT_RST		(1 << 3)
#define SL_CT_FROM_NODE		(1 << 4)	/* opened by the node itself (exempt from policy) */

struct sl_ct_entry {
	__u64 last_seen;	/* bpf_ktime_get_ns() */
	__u32 policy_gen;	/* generation that allowed the flow */
	__u32 dir;		/* SL_DIR_* of the first packet */
	__u32 flags;		/* SL_CT_* */
	__u32 pad;
};

/* Fragments: the first fragment's verdict, for the ones that follow. */
struct sl_frag_key {
	__be32 saddr;
	__be32 daddr;
	__u32 ifindex;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct sl_frag {
	__u64 seen;
};

/* Tunables, in the single entry of the config array. Timeouts in seconds. */
struct sl_config {
	__u32 ct_tcp_syn;
	__u32 ct_tcp_established;
	__u32 ct_tcp_closing;
	__u32 ct_udp;
	__u32 ct_other;
	__u32 events_per_second;	/* per CPU; 0 disables deny events */
	__u32 events_burst;
	__u32 pad;
};

/* Counters: per CPU, indexed by direction * SL_REASONS + reason. */
#define SL_ALLOWED		0	/* passed (new flows and packets of known flows) */
#define SL_ALLOWED_REPLY	1	/* passed as the reply of an allowed flow */
#define SL_DENIED_POLICY	2	/* no rule allows it */
#define SL_DROP_SPOOFED		3	/* source is not the pod's address */
#define SL_DROP_FRAGMENT	4	/* a fragment whose first fragment was not allowed */
#define SL_DROP_MALFORMED	5	/* truncated or invalid headers */
#define SL_DROP_UNSUPPORTED	6	/* a protocol policy cannot judge (e.g. IPv6) */
#define SL_DROP_NO_ENDPOINT	7	/* the veth has no endpoint entry */
#define SL_DROP_FLOW_CUT	8	/* an established flow the new policy denies */
#define SL_REASONS		9

/* Rate-limited deny events, through the ring buffer. */
struct sl_event {
	__u64 timestamp;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 ifindex;
	__u8 proto;
	__u8 dir;
	__u8 reason;
	__u8 pad;
	__u32 pad2;
};

/* Per-CPU token bucket for events, in nanoseconds of credit. */
struct sl_event_budget {
	__u64 last;
	__u64 tokens;
};

#endif /* __SLUICE_H__ */
