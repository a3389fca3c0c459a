/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The decision for one packet crossing an endpoint's veth in one direction.
 *
 * API:
 *   int handle_packet(skb, dir)     SL_PASS or TC_ACT_SHOT
 *
 * In order: the endpoint and its two conntrack tables (none: drop); from the
 * pod, only untagged IPv4 and ARP (ARP only with one of its addresses),
 * whatever the policy; to the pod, anything but IPv4 passes only a
 * direction that is not isolated; from the pod, headers that parse, one
 * of its own source addresses, and no datagram to the tunnel's UDP port
 * (a VXLAN packet made in a pod would be decapsulated by a node and its
 * inner packet delivered with any source: always); later fragments follow their first
 * fragment; ICMP errors pass as related when they quote a flow the
 * endpoint tracks and are addressed to that flow's sender; to the pod,
 * the source's egress verdict after DNAT (services.h); known flows pass
 * (re-checked when the endpoint's policy generation moved on); a new flow
 * needs its direction not isolated, the node or the pod itself as its
 * source (to the pod), a ClusterIP as destination (from the pod: judged
 * after DNAT), or a rule. Every flow allowed in is tracked, so its replies
 * pass both ways.
 */
#ifndef __SL_FLOW_H__
#define __SL_FLOW_H__

#include <uapi/linux/if_arp.h>
#include <uapi/linux/if_ether.h>

#include "conntrack.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "services.h"
#include "verdict.h"

/* Flags a fragment entry inherits from the verdict on its first fragment. */
#define SL_FRAG_INHERITED	(SL_CT_FROM_NODE | SL_CT_SERVICE | SL_CT_SELF)

static __always_inline int isolated(struct sl_endpoint *ep, __u32 dir)
{
	return policy_of(ep, dir) != SL_NONE;
}

/* The address on the other side of the pod. */
static __always_inline __be32 peer_of(struct sl_tuple *t, __u32 dir)
{
	return dir == SL_DIR_EGRESS ? t->daddr : t->saddr;
}

/* One of the pod's own addresses. */
static __always_inline int own_address(struct sl_endpoint *ep, __u32 ifindex, __be32 addr)
{
	__u32 *owner;

	if (addr == ep->ip)
		return 1;
	owner = ep_by_ip.lookup(&addr);
	return owner && *owner == ifindex;
}

static __always_inline int handle_arp(struct __sk_buff *skb, struct sl_endpoint *ep,
				      __u32 ifindex, __u32 dir)
{
	__be32 sender;

	if (dir == SL_DIR_INGRESS)
		return verdict_pass(dir, SL_ALLOWED);
	/* Ethernet, ARP header, sender hardware address, then the sender's IPv4 address. */
	if (bpf_skb_load_bytes(skb, SL_ETH_HLEN + sizeof(struct arphdr) + ETH_ALEN, &sender,
			       sizeof(sender)) < 0)
		return verdict_drop_frame(ifindex, dir, SL_DROP_MALFORMED, bpf_htons(ETH_P_ARP));
	if (sender != 0 && !own_address(ep, ifindex, sender))
		return verdict_drop_frame(ifindex, dir, SL_DROP_SPOOFED, bpf_htons(ETH_P_ARP));
	return verdict_pass(dir, SL_ALLOWED);
}

/* Is a known flow (or fragment) still allowed by the endpoint's current policy? */
static __always_inline int flow_still_allowed(struct sl_ct_shares *ct, struct sl_endpoint *ep,
					      struct sl_ct_key *k, struct sl_ct_entry *e)
{
	__be16 dport = k->dport;

	if (!isolated(ep, e->dir))
		return 1;
	if (e->flags & (SL_CT_SERVICE | SL_CT_SELF))
		return 1;	/* judged after DNAT; a pod may always reach itself */
	if ((e->flags & SL_CT_FROM_NODE) && !(ep->flags & SL_EP_DENY_NODE))
		return 1;
	if (k->kind == SL_CT_FRAG) {
		if (e->flags & SL_CT_SEEN_REPLY) {
			/* Fragments of a reply live as long as their flow, which
			 * was opened the other way (so is in the other share). */
			struct sl_ct_key flow = {
				.saddr = k->daddr, .daddr = k->saddr,
				.sport = e->dport, .dport = e->sport,
				.proto = k->proto, .kind = SL_CT_FLOW,
			};
			void *opened = ct_share(ct, ct_opposite(e->dir));

			return opened && bpf_map_lookup_elem(opened, &flow) != 0;
		}
		dport = e->dport;
	}
	return policy_allows(policy_of(ep, e->dir), e->dir == SL_DIR_EGRESS ? k->daddr : k->saddr,
			     k->proto, dport);
}

/* Bring a known entry (in table, one of ct's) up to the endpoint's generation;
 * 0 (and removed) if denied now. */
static __always_inline int ct_recheck(struct sl_ct_shares *ct, void *table, struct sl_endpoint *ep,
				      __u32 ifindex, struct sl_ct_key *k, struct sl_ct_entry *e)
{
	if (e->policy_gen == ep->policy_gen)
		return 1;
	if (!flow_still_allowed(ct, ep, k, e)) {
		ct_remove(table, ifindex, k);
		return 0;
	}
	e->policy_gen = ep->policy_gen;
	return 1;
}

/* UDP to the tunnel's port, whatever the address: every address of every node
 * (a secondary one too) takes VXLAN there. A later fragment has no port, and
 * is never put together without its first. */
static __always_inline int to_tunnel_port(struct sl_packet *pkt)
{
	__u32 zero = 0;
	struct sl_config *cfg;

	if (pkt->flow.proto != IPPROTO_UDP || pkt->fragment == SL_FRAG_LATER)
		return 0;
	cfg = config.lookup(&zero);
	return cfg && cfg->tunnel_port && pkt->flow.dport == cfg->tunnel_port;
}

/* Sent by the node itself (kubelet probes): made by one of its sockets and not
 * forwarded from any interface. A forwarded packet has no socket (ip_forward
 * drops one that has), whatever the kernel did to it on the way (reassembled
 * and fragmented again for a smaller MTU, segmented), so a missing ingress
 * index alone never makes a packet the node's. */
static __always_inline int from_node(struct __sk_buff *skb)
{
	return skb->ingress_ifindex == 0 && skb->sk;
}

/* A later fragment has no ports: it goes where its first fragment went. */
static __always_inline int handle_later_fragment(struct sl_ct_shares *ct, struct sl_endpoint *ep,
						 __u32 ifindex, __u32 dir, struct sl_packet *pkt)
{
	void *table = ct_share(ct, dir);
	struct sl_ct_entry *e;
	struct sl_ct_key k;

	ct_frag_key(&k, pkt);
	e = ct_get(table, ifindex, &k);
	if (e && ct_recheck(ct, table, ep, ifindex, &k, e))
		return verdict_pass(dir, SL_ALLOWED);
	if (!isolated(ep, dir))
		return verdict_pass(dir, SL_ALLOWED);
	return verdict_drop(ifindex, dir, SL_DROP_FRAGMENT, &pkt->flow);
}

/* An ICMP error goes back to the sender of the packet it quotes, that packet
 * involves the pod on its own side, and it belongs to a tracked flow. */
static __always_inline int handle_icmp_error(struct sl_ct_shares *ct, struct sl_endpoint *ep,
					     __u32 ifindex, __u32 dir, struct sl_packet *pkt)
{
	__be32 pod_side = dir == SL_DIR_EGRESS ? pkt->inner.daddr : pkt->inner.saddr;
	__u32 quoted = ct_opposite(dir);	/* the quoted packet went the other way */
	struct sl_ct_entry *e;
	struct sl_ct_key k;
	int reply = 0;

	if (pkt->fragment != SL_FRAG_NONE || pkt->flow.daddr != pkt->inner.saddr ||
	    !own_address(ep, ifindex, pod_side))
		return verdict_drop(ifindex, dir, SL_DROP_ICMP_ERROR, &pkt->flow);
	e = ct_find(ct, quoted, ifindex, &pkt->inner, &k, &reply);
	if (!e)
		return isolated(ep, dir) ? verdict_drop(ifindex, dir, SL_DROP_ICMP_ERROR, &pkt->flow)
					 : verdict_pass(dir, SL_ALLOWED);
	if (!ct_recheck(ct, ct_share(ct, reply ? dir : quoted), ep, ifindex, &k, e))
		return verdict_drop(ifindex, dir, SL_DROP_FLOW_CUT, &pkt->flow);
	return verdict_pass(dir, SL_ALLOWED_RELATED);
}

static __always_inline int handle_packet(struct __sk_buff *skb, __u32 dir)
{
	__u32 ifindex = skb->ifindex;
	__u32 flags = 0, reason = SL_ALLOWED;
	struct sl_packet pkt = {};
	struct sl_endpoint *ep;
	struct sl_ct_entry *e;
	struct sl_ct_key k;
	struct ethhdr eth;
	int reply = 0, allowed, err;
	struct sl_ct_shares ct;
	void *table;

	ep = endpoints.lookup(&ifindex);
	if (!ep)
		return verdict_drop_frame(ifindex, dir, SL_DROP_NO_ENDPOINT, (__be16)skb->protocol);
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return dir == SL_DIR_EGRESS || isolated(ep, dir)
			       ? verdict_drop_frame(ifindex, dir, SL_DROP_MALFORMED, (__be16)skb->protocol)
			       : verdict_pass(dir, SL_ALLOWED);
	if (dir == SL_DIR_EGRESS) {
		/* Only untagged IPv4 and ARP leave a pod, in every mode: a tag (even
		 * one the kernel took off before this hook) or another ethertype
		 * could be reinterpreted after the datapath passed it. */
		if (skb->vlan_present)
			return verdict_drop_frame(ifindex, dir, SL_DROP_UNSUPPORTED, (__be16)skb->vlan_proto);
		if (eth.h_proto != skb->protocol)
			return verdict_drop_frame(ifindex, dir, SL_DROP_UNSUPPORTED, eth.h_proto);
		if (eth.h_proto == bpf_htons(ETH_P_ARP))
			return handle_arp(skb, ep, ifindex, dir);
		if (eth.h_proto != bpf_htons(ETH_P_IP))
			return verdict_drop_frame(ifindex, dir, SL_DROP_UNSUPPORTED, eth.h_proto);
	} else {
		if (eth.h_proto == bpf_htons(ETH_P_ARP) && !skb->vlan_present)
			return verdict_pass(dir, SL_ALLOWED);
		if (eth.h_proto != bpf_htons(ETH_P_IP) || skb->vlan_present)
			return isolated(ep, dir)
				       ? verdict_drop_frame(ifindex, dir, SL_DROP_UNSUPPORTED,
							    skb->vlan_present ? (__be16)skb->vlan_proto
									      : eth.h_proto)
				       : verdict_pass(dir, SL_ALLOWED);
	}

	err = parse_ipv4(skb, SL_ETH_HLEN, &pkt);
	if (err < 0)
		return dir == SL_DIR_EGRESS || isolated(ep, dir)
			       ? verdict_drop(ifindex, dir, -err, &pkt.flow)
			       : verdict_pass(dir, SL_ALLOWED);
	if (dir == SL_DIR_EGRESS && !own_address(ep, ifindex, pkt.flow.saddr))
		return verdict_drop(ifindex, dir, SL_DROP_SPOOFED, &pkt.flow);
	if (dir == SL_DIR_EGRESS && to_tunnel_port(&pkt))
		return verdict_drop(ifindex, dir, SL_DROP_TUNNEL_PORT, &pkt.flow);
	if (!ct_shares(ep, dir, &ct))
		return verdict_drop(ifindex, dir, SL_DROP_NO_ENDPOINT, &pkt.flow);

	if (pkt.fragment == SL_FRAG_LATER)
		return handle_later_fragment(&ct, ep, ifindex, dir, &pkt);
	if (pkt.icmp_error)
		return handle_icmp_error(&ct, ep, ifindex, dir, &pkt);
	if (dir == SL_DIR_INGRESS) {
		err = judge_source(ifindex, &pkt);
		if (err)
			return err;
	}

	e = ct_find(&ct, dir, ifindex, &pkt.flow, &k, &reply);
	table = ct_share(&ct, reply ? ct_opposite(dir) : dir);
	if (e && ct_is_syn(&pkt)) {
		/* A SYN opens a flow: it is never a reply, and it starts afresh
		 * when it reuses the 5-tuple of a closing or closed one. */
		int closing = ct_is_closing(e);

		if (closing)
			ct_remove(table, ifindex, &k);
		if (reply || closing)
			e = 0;
	}
	if (e) {
		if (!ct_recheck(&ct, table, ep, ifindex, &k, e))
			return verdict_drop(ifindex, dir, SL_DROP_FLOW_CUT, &pkt.flow);
		ct_touch(e, reply, pkt.tcp_flags);
		if (pkt.fragment == SL_FRAG_FIRST)
			ct_frag_create(ct_share(&ct, dir), ifindex, &pkt, ep->policy_gen, dir,
				       (e->flags & SL_FRAG_INHERITED) |
					       (reply ? SL_CT_SEEN_REPLY : 0));
		return verdict_pass(dir, reply ? SL_ALLOWED_REPLY : SL_ALLOWED);
	}

	/* A new flow, or a packet whose entry is gone. Traffic the node itself
	 * sends to its pods (kubelet probes) comes from one of its sockets;
	 * traffic that came in from this very veth is the pod reaching itself
	 * through a Service (hairpin). */
	if (dir == SL_DIR_INGRESS && skb->ingress_ifindex == ifindex)
		flags = SL_CT_SELF;
	else if (dir == SL_DIR_INGRESS && from_node(skb) && !(ep->flags & SL_EP_DENY_NODE))
		flags = SL_CT_FROM_NODE;
	if (flags || !isolated(ep, dir)) {
		allowed = 1;
	} else if (dir == SL_DIR_EGRESS && service_ips.lookup(&pkt.flow.daddr)) {
		/* Judged after DNAT (after_nat.c); while nothing does, refused. */
		if (!services_judged())
			return verdict_drop(ifindex, dir, SL_DROP_UNJUDGED, &pkt.flow);
		allowed = 1;
		flags = SL_CT_SERVICE;
		reason = SL_DEFERRED_SERVICE;
	} else {
		allowed = policy_allows(policy_of(ep, dir), peer_of(&pkt.flow, dir), pkt.flow.proto,
					pkt.flow.dport);
	}
	if (!allowed)
		return verdict_drop(ifindex, dir, SL_DENIED_POLICY, &pkt.flow);
	/* Charged to the direction that opens it: its own share. */
	table = ct_share(&ct, dir);
	if (ct_creates(&pkt))
		ct_create(table, ifindex, &pkt.flow, ep->policy_gen, dir, flags);
	if (pkt.fragment == SL_FRAG_FIRST)
		ct_frag_create(table, ifindex, &pkt, ep->policy_gen, dir, flags);
	return verdict_pass(dir, reason);
}

#endif /* __SL_FLOW_H__ */
