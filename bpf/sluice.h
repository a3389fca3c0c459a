/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Structures and constants shared by the datapath programs and by
 * userspace (cni/datapath/structs.py mirrors every struct here; a test
 * checks sizes and field offsets). Addresses and ports are in network byte
 * order, everything else in host order. Structs are padded explicitly so
 * that C and Python agree without relying on compiler padding.
 *
 * Directions and reasons: vocabulary.h.
 */
#ifndef __SLUICE_H__
#define __SLUICE_H__

#include <linux/types.h>

#include "vocabulary.h"

/* Endpoint flags. */
#define SL_EP_DENY_NODE		(1 << 0)	/* do not exempt traffic from the node */

/* "No policy" (the direction is not isolated) and "no conntrack table". */
#define SL_NONE			0

/* One pod's node-side veth, keyed by its ifindex. Every address of the pod
 * is also a key of ep_by_ip (address -> ifindex).
 *
 * A direction's policy is a policy id: peers[id] and rules[id] hold its rule
 * set. Ids name rule sets by content (endpoints with equal rule sets share
 * one pair of inner maps) and are never reused, so switching an endpoint to
 * another policy is the one write of this entry: a packet sees the old or
 * the new rule set, never a mix. policy_gen moves on with every such
 * write; conntrack entries remember the generation that allowed them and
 * are judged again when it differs.
 *
 * The conntrack table is ct_tables[ct_slot]: slots are filled with empty
 * tables ahead of time (in batches), so attaching an endpoint writes no map
 * of maps; a slot given back is refilled before it is handed out again.
 */
struct sl_endpoint {
	__be32 ip;		/* the pod's first address */
	__u32 policy_gen;	/* moves on whenever the policy ids or flags change */
	__u32 flags;		/* SL_EP_* */
	__u32 ct_slot;		/* its conntrack table's key in ct_tables */
	__u32 egress_policy;	/* policy id of its egress; SL_NONE: not isolated */
	__u32 ingress_policy;	/* policy id of its ingress; SL_NONE: not isolated */
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

#define SL_MAX_RANGES		8
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

/* Conntrack: two LRU tables per endpoint, its two shares: ct_tables[ct_slot]
 * holds the flows the pod opened, ct_tables[ct_slot | SL_CT_INBOUND] the
 * flows opened toward it (and the fragments each way). A pod only ever
 * evicts its own entries, and a peer that opens flows to it by the
 * thousand evicts only other inbound flows, never the replies the pod
 * waits for. A flow is keyed in the direction of its
 * first packet; replies match the reversed key. ICMP echo: a request is
 * (id, 0), its reply (0, id), so only a reply matches a request.
 * A fragment entry (kind SL_CT_FRAG) remembers an allowed first fragment
 * for the ones that follow: sport holds the IP id, dport 0.
 */
#define SL_CT_FLOW	0
#define SL_CT_FRAG	1
#define SL_CT_INBOUND	(1u << 31)	/* the ct_tables key bit of the inbound share */

struct sl_ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 kind;		/* SL_CT_FLOW, SL_CT_FRAG */
	__u8 pad[2];
};

#define SL_CT_SEEN_REPLY	(1 << 0)
#define SL_CT_FIN_ORIG		(1 << 1)
#define SL_CT_FIN_REPLY		(1 << 2)
#define SL_CT_RST		(1 << 3)
#define SL_CT_FROM_NODE		(1 << 4)	/* opened by the node itself (exempt from policy) */
#define SL_CT_SERVICE		(1 << 5)	/* to a ClusterIP: judged after DNAT, not here */
#define SL_CT_POST_DNAT		(1 << 6)	/* the source's verdict on a service flow after DNAT */
#define SL_CT_SELF		(1 << 7)	/* the pod reaching itself (hairpin) */

struct sl_ct_entry {
	__u64 last_seen;	/* bpf_ktime_get_ns() */
	__u32 policy_gen;	/* generation that allowed the flow */
	__u32 flags;		/* SL_CT_* */
	__u8 dir;		/* SL_DIR_* of the first packet */
	__u8 pad;
	__be16 sport;		/* fragments: the ports of the first fragment */
	__be16 dport;
	__u16 pad2;
};

/* Per endpoint: conntrack entries the datapath created and removed (expired,
 * cut, superseded). created - removed - live entries = evicted by the LRU.
 */
struct sl_ep_stats {
	__u64 ct_created;
	__u64 ct_removed;
};

/* ClusterIPs (service_ips: address -> flags). */
#define SL_SVC_CLUSTER_IP	(1 << 0)

/* The cluster's pod ranges and who holds each (pod_ranges: an LPM of struct
 * sl_peer_key -> struct sl_pod_range), kept by the agent's route keeper:
 * each other node's ranges with its InternalIP, this node's own, and the
 * whole cluster range as held by nobody known. A packet from the node network
 * whose source lies in them must come from the node that holds it. */
#define SL_RANGE_LOCAL		(1 << 0)	/* this node's own: never from the network */
#define SL_RANGE_UNOWNED	(1 << 1)	/* no node is known to hold it */

struct sl_pod_range {
	__be32 node;		/* the InternalIP of the node that holds it (0: none) */
	__u32 flags;		/* SL_RANGE_* */
};

/* Tunables, in the single entry of the config array. Timeouts in seconds. */
struct sl_config {
	__u32 ct_tcp_syn;
	__u32 ct_tcp_established;
	__u32 ct_tcp_closing;
	__u32 ct_udp;
	__u32 ct_other;
	__u32 ct_fragment;
	__u32 events_per_second;	/* per CPU; 0 disables deny events */
	__u32 events_burst;
	__u32 ct_per_endpoint;		/* entries of each endpoint's table (userspace sizes them) */
	__be16 tunnel_port;		/* UDP port of the node's tunnel; 0: routing is native */
	__u16 pad;
	__u32 tunnel_vni;		/* the tunnel's VXLAN network identifier */
	__u32 after_nat;		/* 1: after_nat is on netfilter's hooks (judges service flows) */
};

/* Rate-limited deny events, through the ring buffer. */
struct sl_event {
	__u64 timestamp;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 ifindex;		/* the endpoint whose policy denied (the source's, after DNAT) */
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

/* Userspace bookkeeping, pinned beside the maps so that every writer (the
 * agent, the plugin, sluicectl) shares it; the programs never read it.
 *
 * policy_index: the digest of a compiled rule set -> its policy id, so any
 * writer finds the id of a rule set that is already installed.
 */
struct sl_policy_digest {
	__u8 bytes[32];		/* SHA-256 of the rule set's map entries */
};

/* ledger[0]: id counters (ids are never reused) and how many conntrack
 * tables and policy references were given back since the last reap (the
 * reaper resets them; writers without a background reaper reap above a
 * threshold).
 */
struct sl_ledger {
	__u32 next_policy_id;
	__u32 next_ct_slot;
	__u32 released_tables;
	__u32 released_policies;
};

#endif /* __SLUICE_H__ */
