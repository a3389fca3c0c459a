/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Policy lookup for one endpoint, generation and direction.
 *
 * API:
 *   int policy_allows(ifindex, gen, dir, peer, proto, dport)   1 allow, 0 deny
 *
 * Two steps: the peer's address -> its peer set (LPM), then the peer set,
 * protocol and destination port -> allow (exact port, then the set's
 * any-port flag and port ranges for the protocol, then any protocol).
 */
#ifndef __SL_POLICY_H__
#define __SL_POLICY_H__

#include "maps.h"

static __always_inline int policy_allows(__u32 ifindex, __u32 gen, __u32 dir, __be32 peer,
					 __u8 proto, __be16 dport)
{
	struct sl_policy_key pk = { .ifindex = ifindex, .gen = gen, .dir = dir };
	struct sl_peer_key peer_key = { .prefixlen = 32, .addr = peer };
	struct sl_rule_key rk = {};
	struct sl_peer *set;
	struct sl_rule *rule;
	void *peer_map, *rule_map;
	__u16 port = bpf_ntohs(dport);
	int i;

	peer_map = peers.lookup(&pk);
	rule_map = rules.lookup(&pk);
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
