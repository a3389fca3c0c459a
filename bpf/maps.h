/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The datapath's maps, all pinned under SL_PIN_DIR (the network's bpfDir,
 * passed by the loader), so every program and every later load share them
 * and a reload keeps endpoints, policies and conntrack.
 *
 * API (maps): endpoints, ep_by_ip, service_ips, peers, rules, ct_tables,
 * ep_stats, config, counters, event_budget, events, pod_ranges, tunnel_peers;
 * and for userspace only:
 * policy_index, ct_free, ct_dirty, ledger.
 *
 * Policies live in inner maps reached through two outer maps keyed by
 * policy id (sluice.h: struct sl_endpoint); conntrack tables in LRU inner
 * maps reached through ct_tables, keyed by slot. Every insert, replace or
 * delete of an outer map's element makes the kernel wait for an RCU grace
 * period, so userspace inserts in batches (one wait per batch), never on
 * an endpoint's attach or detach when the pool of empty tables is
 * stocked, and deletes garbage later, off the CNI path (the reaper).
 *
 * Sizes are compiled in; the loader passes them (-D) from the network
 * config and records them in the layout marker beside the pins.
 */
#ifndef __SL_MAPS_H__
#define __SL_MAPS_H__

#include "sluice.h"

#ifndef SL_PIN_DIR
#error "SL_PIN_DIR must name the bpffs directory to pin maps in"
#endif

#define SL_NSEC_PER_SEC		1000000000ULL

#ifndef SL_MAX_ENDPOINTS
#define SL_MAX_ENDPOINTS	16384
#endif
#ifndef SL_MAX_SERVICES
#define SL_MAX_SERVICES		65536
#endif
/* Rule sets: at most two per endpoint, plus garbage the reaper has not
 * deleted yet. Conntrack tables: one per endpoint, plus the pool of empty
 * ones and garbage. */
#define SL_MAX_POLICIES		(4 * SL_MAX_ENDPOINTS)
#define SL_MAX_CT_TABLES	(4 * SL_MAX_ENDPOINTS)	/* two shares, twice the endpoints */
#define SL_MAX_POD_IPS		(4 * SL_MAX_ENDPOINTS)
#define SL_EVENTS_BYTES		(256 * 1024)
/* Pod ranges of the cluster (a node's podCIDR, or each /28 it claimed) and the
 * addresses of the nodes that are tunnel peers. */
#define SL_MAX_POD_RANGES	65536
#define SL_MAX_NODES		16384

BPF_TABLE_PINNED("hash", __u32, struct sl_endpoint, endpoints, SL_MAX_ENDPOINTS,
		 SL_PIN_DIR "/endpoints");
/* Every address of every local pod -> its endpoint (anti-spoofing, Services). */
BPF_TABLE_PINNED("hash", __be32, __u32, ep_by_ip, SL_MAX_POD_IPS, SL_PIN_DIR "/ep_by_ip");
BPF_TABLE_PINNED("hash", __be32, __u32, service_ips, SL_MAX_SERVICES, SL_PIN_DIR "/service_ips",
		 BPF_F_NO_PREALLOC);

/* Who holds which pod range (sluice.h: struct sl_pod_range), and the node
 * addresses the tunnel accepts packets from; both kept by the agent. */
BPF_TABLE_PINNED("lpm_trie", struct sl_peer_key, struct sl_pod_range, pod_ranges,
		 SL_MAX_POD_RANGES, SL_PIN_DIR "/pod_ranges", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("hash", __be32, __u32, tunnel_peers, SL_MAX_NODES, SL_PIN_DIR "/tunnel_peers",
		 BPF_F_NO_PREALLOC);

/* Templates for the inner maps (userspace creates the real ones). */
BPF_F_TABLE("lpm_trie", struct sl_peer_key, struct sl_peer, peer_template, 1,
	    BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct sl_rule_key, struct sl_rule, rule_template, 1, BPF_F_NO_PREALLOC);
BPF_F_TABLE("lru_hash", struct sl_ct_key, struct sl_ct_entry, ct_template, 1, 0);

BPF_TABLE("hash_of_maps$peer_template:" SL_PIN_DIR "/peers", __u32, int, peers,
	  SL_MAX_POLICIES);
BPF_TABLE("hash_of_maps$rule_template:" SL_PIN_DIR "/rules", __u32, int, rules,
	  SL_MAX_POLICIES);
BPF_TABLE("hash_of_maps$ct_template:" SL_PIN_DIR "/ct_tables", __u32, int, ct_tables,
	  SL_MAX_CT_TABLES);

BPF_TABLE_PINNED("hash", __u32, struct sl_ep_stats, ep_stats, SL_MAX_ENDPOINTS,
		 SL_PIN_DIR "/ep_stats");
BPF_TABLE_PINNED("array", __u32, struct sl_config, config, 1, SL_PIN_DIR "/config");
BPF_TABLE_PINNED("percpu_array", __u32, __u64, counters, SL_DIRS * SL_REASONS,
		 SL_PIN_DIR "/counters");
BPF_TABLE_PINNED("percpu_array", __u32, struct sl_event_budget, event_budget, 1,
		 SL_PIN_DIR "/event_budget");

/* Userspace bookkeeping (sluice.h): rule set digest -> policy id; empty
 * conntrack tables ready to hand out (slot -> capacity); tables given back,
 * waiting for the reaper (slot -> 0); id counters and release counts. */
BPF_TABLE_PINNED("hash", struct sl_policy_digest, __u32, policy_index, SL_MAX_POLICIES,
		 SL_PIN_DIR "/policy_index", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("hash", __u32, __u32, ct_free, SL_MAX_CT_TABLES, SL_PIN_DIR "/ct_free",
		 BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("hash", __u32, __u32, ct_dirty, SL_MAX_CT_TABLES, SL_PIN_DIR "/ct_dirty",
		 BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("array", __u32, struct sl_ledger, ledger, 1, SL_PIN_DIR "/ledger");

/* bcc has no pinned form of BPF_RINGBUF_OUTPUT; this is its table with a pin path. */
struct events_table_t {
	int key;
	__u32 leaf;
	int (*ringbuf_output)(void *, __u64, __u64);
	void *(*ringbuf_reserve)(__u64);
	void (*ringbuf_discard)(void *, __u64);
	void (*ringbuf_submit)(void *, __u64);
	__u64 (*ringbuf_query)(__u64);
	__u32 max_entries;
};
__attribute__((section("maps/ringbuf:" SL_PIN_DIR "/events")))
struct events_table_t events = { .max_entries = SL_EVENTS_BYTES };

#endif /* __SL_MAPS_H__ */
