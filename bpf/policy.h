/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Policy lookup: one rule set, named by its policy id.
 *
 * API:
 *   __u32 policy_of(ep, dir)                          the endpoint's policy id for dir
 *   int policy_allows(policy, peer, proto, dport)     1 allow, 0 deny
 *
 * Two steps: the peer's address -> its peer set (LPM), then the peer set,
 * protocol and destination port -> allow (exact port, then the set's
 * any-port flag and port ranges for the protocol, then any protocol).
 */
#ifndef __SL_POLICY_H__
#define __SL_POLICY_H__

#include "maps.h"

/* SL_NONE when the direction is not isolated. */
static __always_inline __u32 policy_of(struct sl_endpoint *ep, __u32 dir)
{
	return dir == SL_DIR_EGRESS ? ep->egress_policy : ep->ingress_policy;
}

/* A missing rule set (SL_NONE included) allows nothing. */
static __always_inline int policy_allows(__u32 policy, __be32 peer, __u8 proto, __be16 dport)
{
	struct sl_peer_key peer_key = { .prefixlen = 32, .addr = peer };
	struct sl_rule_key rk = {};
	struct sl_peer *set;
	struct sl_rule *rule;
	void *peer_map, *rule_map;
	__u16 port = bpf_ntohs(dport);
	int i;

	peer_map = peers.lookup(&policy);
	rule_map = rules.lookup(&policy);
	if (!peer_map || !rule_map)
		return 0;
	set = bpf_map_lookup_elem(peer_map, &peer_key);
	if (!set)
		return 0;

	rk.set = set->set;
	rk.proto = proto;
	if (port) {
		rk.port = dport;
		if (bpf_map_lookup_elem(rule_map, &rk))
			return 1;
		rk.port = 0;
	}
	rule = bpf_map_lookup_elem(rule_map, &rk);
	if (rule) {
		if (rule->flags & SL_RULE_ANY_PORT)
			return 1;
#pragma unroll
		for (i = 0; i < SL_MAX_RANGES; i++) {
			if (i >= rule->nranges)
				break;
			if (port >= rule->ranges[i].first && port <= rule->ranges[i].last)
				return 1;
		}
	}
	rk.proto = 0;
	return bpf_map_lookup_elem(rule_map, &rk) != 0;
}

#endif /* __SL_POLICY_H__ */
