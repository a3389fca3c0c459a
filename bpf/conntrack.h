/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The datapath's own conntrack: two LRU tables per endpoint (the flows it
 * opened, the flows opened toward it: sluice.h), aged in the
 * datapath by comparing last_seen with the timeout for the flow's state
 * (never by looking at netfilter's conntrack).
 *
 * API:
 *   int ct_shares(ep, dir, &ct)                      the endpoint's tables, dir's looked up
 *                                                    (0: missing)
 *   void *ct_share(&ct, dir)                         the table of flows opened in dir
 *                                                    (looked up once, when first needed;
 *                                                    NULL if missing: every helper takes it)
 *   struct sl_ct_entry *ct_find(&ct, dir, owner, t, &key, &reply)   live entry or NULL
 *   void ct_create(table, owner, t, gen, dir, flags)
 *   void ct_frag_create(table, owner, pkt, gen, dir, flags)   an allowed first fragment
 *   void ct_remove(table, owner, &key)
 *   void ct_touch(e, reply, tcp_flags)
 *   int ct_creates(pkt)                              may this packet open a flow
 *   int ct_is_closing(e)
 *
 * Only a TCP SYN without ACK, an ICMP echo request, or the first packet
 * of a flow of another protocol creates an entry: a mid-stream packet
 * whose entry was lost is judged by the policy of the direction it travels
 * and never recorded as a new flow in the other direction.
 */
#ifndef __SL_CONNTRACK_H__
#define __SL_CONNTRACK_H__

#include "maps.h"
#include "parse.h"

/* An endpoint's two shares of conntrack. A packet of a flow opened its own
 * way finds it in its direction's share, looked up first; the other share
 * (replies, ICMP errors) is looked up only when needed: one ct_tables lookup
 * for most packets of a transfer, as with one table per endpoint. */
struct sl_ct_shares {
	void *out;	/* flows the pod opened (and fragments it sends) */
	void *in;	/* flows opened toward the pod (and fragments it receives) */
	__u32 slot;
};

static __always_inline void *ct_table_of(__u32 slot, __u32 dir)
{
	__u32 key = dir == SL_DIR_EGRESS ? slot : slot | SL_CT_INBOUND;

	return ct_tables.lookup(&key);
}

static __always_inline int ct_shares(struct sl_endpoint *ep, __u32 dir, struct sl_ct_shares *ct)
{
	void *first = ct_table_of(ep->ct_slot, dir);

	ct->slot = ep->ct_slot;
	ct->out = dir == SL_DIR_EGRESS ? first : 0;
	ct->in = dir == SL_DIR_EGRESS ? 0 : first;
	return first != 0;
}

static __always_inline __u32 ct_opposite(__u32 dir)
{
	return dir == SL_DIR_EGRESS ? SL_DIR_INGRESS : SL_DIR_EGRESS;
}

/* The table of the flows opened in direction dir (NULL: missing). */
static __always_inline void *ct_share(struct sl_ct_shares *ct, __u32 dir)
{
	if (dir == SL_DIR_EGRESS) {
		if (!ct->out)
			ct->out = ct_table_of(ct->slot, dir);
		return ct->out;
	}
	if (!ct->in)
		ct->in = ct_table_of(ct->slot, dir);
	return ct->in;
}

static __always_inline void ct_key(struct sl_ct_key *k, struct sl_tuple *t, int reversed)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->saddr = reversed ? t->daddr : t->saddr;
	k->daddr = reversed ? t->saddr : t->daddr;
	k->sport = reversed ? t->dport : t->sport;
	k->dport = reversed ? t->sport : t->dport;
	k->proto = t->proto;
	k->kind = SL_CT_FLOW;
}

static __always_inline int ct_is_closing(struct sl_ct_entry *e)
{
	return (e->flags & SL_CT_RST) ||
	       ((e->flags & SL_CT_FIN_ORIG) && (e->flags & SL_CT_FIN_REPLY));
}

static __always_inline __u64 ct_timeout(struct sl_ct_key *k, struct sl_ct_entry *e)
{
	__u32 zero = 0;
	struct sl_config *cfg = config.lookup(&zero);
	__u32 seconds = 60;

	if (!cfg)
		return seconds * SL_NSEC_PER_SEC;
	if (k->kind == SL_CT_FRAG) {
		seconds = cfg->ct_fragment;
	} else if (k->proto == IPPROTO_TCP) {
		if (ct_is_closing(e))
			seconds = cfg->ct_tcp_closing;
		else if (e->flags & (SL_CT_SEEN_REPLY | SL_CT_POST_DNAT))
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

static __always_inline void ct_count(__u32 owner, int created)
{
	struct sl_ep_stats *stats = ep_stats.lookup(&owner);

	if (!stats)
		return;
	if (created)
		__sync_fetch_and_add(&stats->ct_created, 1);
	else
		__sync_fetch_and_add(&stats->ct_removed, 1);
}

static __always_inline void ct_remove(void *table, __u32 owner, struct sl_ct_key *k)
{
	if (table && bpf_map_delete_elem(table, k) == 0)
		ct_count(owner, 0);
}

/* The live entry under key k, or NULL (an expired one is removed). */
static __always_inline struct sl_ct_entry *ct_get(void *table, __u32 owner, struct sl_ct_key *k)
{
	struct sl_ct_entry *e;

	if (!table)
		return 0;
	e = bpf_map_lookup_elem(table, k);
	if (!e)
		return 0;
	if (bpf_ktime_get_ns() - e->last_seen > ct_timeout(k, e)) {
		ct_remove(table, owner, k);
		return 0;
	}
	return e;
}

/* The live entry for the flow of a packet travelling in direction dir: a flow
 * opened that way (in dir's share), else one whose reply it is (in the other
 * share). The entry lives in ct_share(ct, *reply ? ct_opposite(dir) : dir). */
static __always_inline struct sl_ct_entry *ct_find(struct sl_ct_shares *ct, __u32 dir,
						   __u32 owner, struct sl_tuple *t,
						   struct sl_ct_key *k, int *reply)
{
	struct sl_ct_entry *e;

	ct_key(k, t, 0);
	e = ct_get(ct_share(ct, dir), owner, k);
	if (e) {
		*reply = 0;
		return e;
	}
	ct_key(k, t, 1);
	e = ct_get(ct_share(ct, ct_opposite(dir)), owner, k);
	if (e) {
		*reply = 1;
		return e;
	}
	return 0;
}

static __always_inline void ct_touch(struct sl_ct_entry *e, int reply, __u8 tcp_flags)
{
	__u32 flags = e->flags;
	__u64 now;

	if (reply)
		flags |= SL_CT_SEEN_REPLY;
	if (tcp_flags & SL_TCP_FIN)
		flags |= reply ? SL_CT_FIN_REPLY : SL_CT_FIN_ORIG;
	if (tcp_flags & SL_TCP_RST)
		flags |= SL_CT_RST;
	if (flags != e->flags)
		e->flags = flags;
	/* Refresh at most once per second: fewer writes to a shared cache line. */
	now = bpf_ktime_get_ns();
	if (now - e->last_seen > SL_NSEC_PER_SEC)
		e->last_seen = now;
}

static __always_inline int ct_is_syn(struct sl_packet *pkt)
{
	return pkt->flow.proto == IPPROTO_TCP &&
	       (pkt->tcp_flags & (SL_TCP_SYN | SL_TCP_ACK | SL_TCP_RST)) == SL_TCP_SYN;
}

static __always_inline int ct_creates(struct sl_packet *pkt)
{
	switch (pkt->flow.proto) {
	case IPPROTO_TCP:
		return ct_is_syn(pkt);
	case IPPROTO_ICMP:
		return pkt->icmp_type == ICMP_ECHO;
	default:
		return 1;
	}
}

static __always_inline void ct_create(void *table, __u32 owner, struct sl_tuple *t, __u32 gen,
				      __u32 dir, __u32 flags)
{
	struct sl_ct_key k;
	struct sl_ct_entry e = {};

	if (!table)
		return;
	ct_key(&k, t, 0);
	e.last_seen = bpf_ktime_get_ns();
	e.policy_gen = gen;
	e.dir = dir;
	e.flags = flags;
	if (bpf_map_update_elem(table, &k, &e, BPF_ANY) == 0)
		ct_count(owner, 1);
}

/* Fragments: the first fragment's verdict, for the ones that follow. */
static __always_inline void ct_frag_key(struct sl_ct_key *k, struct sl_packet *pkt)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->saddr = pkt->flow.saddr;
	k->daddr = pkt->flow.daddr;
	k->sport = pkt->ip_id;
	k->proto = pkt->flow.proto;
	k->kind = SL_CT_FRAG;
}

static __always_inline void ct_frag_create(void *table, __u32 owner, struct sl_packet *pkt,
					   __u32 gen, __u32 dir, __u32 flags)
{
	struct sl_ct_key k;
	struct sl_ct_entry e = {};

	if (!table)
		return;
	ct_frag_key(&k, pkt);
	e.last_seen = bpf_ktime_get_ns();
	e.policy_gen = gen;
	e.dir = dir;
	e.flags = flags;
	e.sport = pkt->flow.sport;
	e.dport = pkt->flow.dport;
	if (bpf_map_update_elem(table, &k, &e, BPF_ANY) == 0)
		ct_count(owner, 1);
}

#endif /* __SL_CONNTRACK_H__ */
