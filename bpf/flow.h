/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The decision for one packet crossing an endpoint's veth in one direction.
 *
 * API:
 *   int handle_packet(skb, dir)     SL_PASS or TC_ACT_SHOT
 *
 * In order: the endpoint (none: drop); ARP (from the pod only with its own
 * address); anything but IPv4 passes only a direction that is not isolated;
 * the pod's own source address (always); later fragments follow their first
 * fragment; ICMP errors about known flows pass as related; known flows pass
 * (re-checked when the endpoint's policy generation moved on); a new flow
 * needs its direction not isolated, the node as its source (to the pod), or
 * a rule. Every flow allowed in is tracked, so its replies pass both ways.
 */
#ifndef __SL_FLOW_H__
#define __SL_FLOW_H__

#include <uapi/linux/if_arp.h>
#include <uapi/linux/if_ether.h>

#include "conntrack.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "verdict.h"

static __always_inline int isolated(struct sl_endpoint *ep, __u32 dir)
{
	__u32 bit = dir == SL_DIR_EGRESS ? SL_EP_ISOLATED_EGRESS : SL_EP_ISOLATED_INGRESS;

	return (ep->flags & bit) != 0;
}

/* The address on the other side of the pod, and the port the flow goes to. */
static __always_inline __be32 peer_of(struct sl_tuple *t, __u32 dir)
{
	return dir == SL_DIR_EGRESS ? t->daddr : t->saddr;
}

static __always_inline int handle_arp(struct __sk_buff *skb, struct sl_endpoint *ep, __u32 dir)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	/* Ethernet, ARP header, sender hardware address, then the sender's IPv4 address. */
	__be32 *sender = data + sizeof(struct ethhdr) + sizeof(struct arphdr) + ETH_ALEN;

	if (dir == SL_DIR_INGRESS)
		return verdict_pass(dir, SL_ALLOWED);
	if ((void *)(sender + 1) > data_end)
		return verdict_drop(skb, dir, SL_DROP_MALFORMED, 0);
	if (*sender != ep->ip && *sender != 0)
		return verdict_drop(skb, dir, SL_DROP_SPOOFED, 0);
	return verdict_pass(dir, SL_ALLOWED);
}

static __always_inline int handle_fragment(struct __sk_buff *skb, struct sl_endpoint *ep,
					   __u32 dir, struct sl_packet *pkt, int allowed)
{
	struct sl_frag_key k = {
		.saddr = pkt->flow.saddr,
		.daddr = pkt->flow.daddr,
		.ifindex = skb->ifindex,
		.id = pkt->ip_id,
		.proto = pkt->flow.proto,
	};

	if (pkt->fragment == SL_FRAG_FIRST && allowed) {
		struct sl_frag seen = { .seen = bpf_ktime_get_ns() };

		fragments.update(&k, &seen);
		return 1;
	}
	/* A later fragment has no ports: it goes where its first fragment went. */
	if (fragments.lookup(&k) || !isolated(ep, dir))
		return 1;
	return 0;
}

/* Re-check a known flow against the endpoint's current policy. */
static __always_inline int flow_still_allowed(struct sl_endpoint *ep, __u32 ifindex,
					      struct sl_ct_key *k, struct sl_ct_entry *e)
{
	struct sl_tuple orig = {
		.saddr = k->saddr, .daddr = k->daddr,
		.sport = k->sport, .dport = k->dport, .proto = k->proto,
	};

	if (!isolated(ep, e->dir))
		return 1;
	if ((e->flags & SL_CT_FROM_NODE) && !(ep->flags & SL_EP_DENY_NODE))
		return 1;
	return policy_allows(ifindex, ep->policy_gen, e->dir, peer_of(&orig, e->dir), orig.proto,
			     orig.dport);
}

static __always_inline int handle_packet(struct __sk_buff *skb, __u32 dir)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 ifindex = skb->ifindex;
	struct sl_packet pkt = {};
	struct sl_endpoint *ep;
	struct sl_ct_entry *e;
	struct sl_ct_key k;
	int reply = 0, from_node, allowed, err;

	ep = endpoints.lookup(&ifindex);
	if (!ep)
		return verdict_drop(skb, dir, SL_DROP_NO_ENDPOINT, 0);
	if ((void *)(eth + 1) > data_end)
		return isolated(ep, dir) ? verdict_drop(skb, dir, SL_DROP_MALFORMED, 0)
					 : verdict_pass(dir, SL_ALLOWED);
	if (eth->h_proto == bpf_htons(ETH_P_ARP))
		return handle_arp(skb, ep, dir);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return isolated(ep, dir) ? verdict_drop(skb, dir, SL_DROP_UNSUPPORTED, 0)
					 : verdict_pass(dir, SL_ALLOWED);

	err = parse_ipv4(skb, &pkt);
	if (err < 0)
		return isolated(ep, dir) || dir == SL_DIR_EGRESS
			       ? verdict_drop(skb, dir, -err, 0)
			       : verdict_pass(dir, SL_ALLOWED);
	if (dir == SL_DIR_EGRESS && pkt.flow.saddr != ep->ip)
		return verdict_drop(skb, dir, SL_DROP_SPOOFED, &pkt);

	if (pkt.fragment == SL_FRAG_LATER)
		return handle_fragment(skb, ep, dir, &pkt, 0) ? verdict_pass(dir, SL_ALLOWED)
							       : verdict_drop(skb, dir, SL_DROP_FRAGMENT, &pkt);

	if (pkt.icmp_error && ct_related(&pkt.inner, ifindex)) {
		if (pkt.fragment == SL_FRAG_FIRST)
			handle_fragment(skb, ep, dir, &pkt, 1);
		return verdict_pass(dir, SL_ALLOWED_REPLY);
	}

	e = ct_find(&pkt.flow, ifindex, &k, &reply);
	if (e) {
		if (e->policy_gen != ep->policy_gen) {
			if (!flow_still_allowed(ep, ifindex, &k, e)) {
				conntrack.delete(&k);
				return verdict_drop(skb, dir, SL_DROP_FLOW_CUT, &pkt);
			}
			e->policy_gen = ep->policy_gen;
		}
		ct_touch(e, reply, pkt.tcp_flags);
		if (pkt.fragment == SL_FRAG_FIRST)
			handle_fragment(skb, ep, dir, &pkt, 1);
		return verdict_pass(dir, reply ? SL_ALLOWED_REPLY : SL_ALLOWED);
	}

	/* A new flow. Traffic the node itself sends to its pods (kubelet probes)
	 * was not forwarded from any interface.
	 */
	from_node = dir == SL_DIR_INGRESS && skb->ingress_ifindex == 0 &&
		    !(ep->flags & SL_EP_DENY_NODE);
	allowed = !isolated(ep, dir) || from_node ||
		  policy_allows(ifindex, ep->policy_gen, dir, peer_of(&pkt.flow, dir),
				pkt.flow.proto, pkt.flow.dport);
	if (!allowed)
		return verdict_drop(skb, dir, SL_DENIED_POLICY, &pkt);
	ct_create(&pkt.flow, ifindex, ep->policy_gen, dir, pkt.tcp_flags, from_node);
	if (pkt.fragment == SL_FRAG_FIRST)
		handle_fragment(skb, ep, dir, &pkt, 1);
	return verdict_pass(dir, SL_ALLOWED);
}

#endif /* __SL_FLOW_H__ */
