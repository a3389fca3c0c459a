/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The datapath's own conntrack: one entry per flow and endpoint, aged in
 * the datapath by comparing last_seen with the timeout for the flow's state
 * (never by looking at netfilter's conntrack).
 *
 * API:
 *   struct sl_ct_entry *ct_find(t, ifindex, &key, &reply)  live entry or NULL
 *   void ct_create(t, ifindex, gen, dir, tcp_flags, from_node)
 *   void ct_touch(e, reply, tcp_flags)
 *   int ct_related(inner, ifindex)                 an ICMP error about a known flow
 */
#ifndef __SL_CONNTRACK_H__
#define __SL_CONNTRACK_H__

#include "maps.h"
#include "parse.h"

static __always_inline void ct_key(struct sl_ct_key *k, struct sl_tuple *t, __u32 ifindex,
				   int reversed)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->saddr = reversed ? t->daddr : t->saddr;
	k->daddr = reversed ? t->saddr : t->daddr;
	k->sport = reversed ? t->dport : t->sport;
	k->dport = reversed ? t->sport : t->dport;
	k->ifindex = ifindex;
	k->proto = t->proto;
}

static __always_inline __u64 ct_timeout(struct sl_ct_key *k, struct sl_ct_entry *e)
{
	__u32 zero = 0;
	struct sl_config *cfg = config.lookup(&zero);
	__u32 seconds = 60;

	if (!cfg)
		return seconds * SL_NSEC_PER_SEC;
	if (k->proto == IPPROTO_TCP) {
		if ((e->flags & SL_CT_RST) ||
		    ((e->flags & SL_CT_FIN_ORIG) && (e->flags & SL_CT_FIN_REPLY)))
			seconds = cfg->ct_tcp_closing;
		else if (e->flags & SL_CT_SEEN_REPLY)
			seconds = cfg->ct_tcp_established;
		else
			seconds = cfg->ct_tcp_syn;
	} else if (k->proto == IPPROTO_UDP) {
		seconds = cfg->ct_udp;
	} else {
		seconds = cfg->ct_other;
	}
	return (__u64)seconds * SL_NSEC_PER_SEC;
}

/* The live entry for the flow, trying the packet's direction, then the reply's. */
static __always_inline struct sl_ct_entry *ct_find(struct sl_tuple *t, __u32 ifindex,
						   struct sl_ct_key *k, int *reply)
{
	struct sl_ct_entry *e;
	int reversed;

	for (reversed = 0; reversed < 2; reversed++) {
		ct_key(k, t, ifindex, reversed);
		e = conntrack.lookup(k);
		if (!e)
			continue;
		if (bpf_ktime_get_ns() - e->last_seen > ct_timeout(k, e)) {
			conntrack.delete(k);
			return 0;
		}
		*reply = reversed;
		return e;
	}
	return 0;
}

static __always_inline void ct_touch(struct sl_ct_entry *e, int reply, __u8 tcp_flags)
{
	__u32 flags = e->flags;

	if (reply)
		flags |= SL_CT_SEEN_REPLY;
	if (tcp_flags & SL_TCP_FIN)
		flags |= reply ? SL_CT_FIN_REPLY : SL_CT_FIN_ORIG;
	if (tcp_flags & SL_TCP_RST)
		flags |= SL_CT_RST;
	if (flags != e->flags)
		e->flags = flags;
	/* Refresh at most once per second: fewer writes to a shared cache line. */
	__u64 now = bpf_ktime_get_ns();
	if (now - e->last_seen > SL_NSEC_PER_SEC)
		e->last_seen = now;
}

static __always_inline void ct_create(struct sl_tuple *t, __u32 ifindex, __u32 gen, __u32 dir,
				      __u8 tcp_flags, int from_node)
{
	struct sl_ct_key k;
	struct sl_ct_entry e = {};

	ct_key(&k, t, ifindex, 0);
	e.last_seen = bpf_ktime_get_ns();
	e.policy_gen = gen;
	e.dir = dir;
	if (tcp_flags & SL_TCP_RST)
		e.flags |= SL_CT_RST;
	if (from_node)
		e.flags |= SL_CT_FROM_NODE;
	conntrack.update(&k, &e);
}

/* An ICMP error is related to a flow this endpoint already allowed. */
static __always_inline int ct_related(struct sl_tuple *inner, __u32 ifindex)
{
	struct sl_ct_key k;
	int reply;

	return ct_find(inner, ifindex, &k, &reply) != 0;
}

#endif /* __SL_CONNTRACK_H__ */
