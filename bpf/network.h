/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the node accepts from its network (the uplinks' tcx ingress): packets
 * that claim to come from a pod must come from the node that holds that pod.
 *
 * API:
 *   int judge_from_network(skb)     SL_PASS or TC_ACT_SHOT (counted)
 *
 * Two cases, by what the packet is:
 * - UDP to the tunnel's port (config: tunnel_port, 0 in native routing): a
 *   VXLAN packet. Its outer source must be a tunnel peer (tunnel_peers), sent
 *   from the link-layer address the node reaches that peer at; its VXLAN header
 *   must carry the tunnel's VNI; the frame inside must be IPv4 whose source lies
 *   in a pod range (pod_ranges) held by that same peer (each node's own traffic
 *   enters the tunnel from the tunnel address in its own range), or is the
 *   peer's own address. Anything else
 *   is dropped, also a first fragment too short to show all of that (later
 *   fragments cannot change it: Linux refuses overlapping IPv4 fragments).
 * - anything else whose source lies in a pod range: it must arrive on the
 *   interface the node routes that source through, from the link-layer address
 *   of the next hop, and the next hop must be the node that holds the range
 *   (a reverse path check down to the MAC, by bpf_fib_lookup, so it follows
 *   the node's routes and neighbour table as they are). A source in this
 *   node's own range, or in the cluster range held by no known node, is never
 *   accepted from the network.
 * Packets whose source is no pod's pass: the node's own firewall and the pods'
 * policies judge them.
 */
#ifndef __SL_NETWORK_H__
#define __SL_NETWORK_H__

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>

#include "maps.h"
#include "parse.h"
#include "verdict.h"

#define SL_UDP_HLEN		8
#define SL_VXLAN_HLEN		8
#define SL_VXLAN_FLAG_VNI	0x08	/* the I flag: the VNI is valid */
#define SL_AF_INET		2

struct sl_vxlan {
	__u8 flags;
	__u8 reserved[3];
	__be32 vni_reserved;	/* VNI in the upper 24 bits */
};

/* The node's route back to addr: is it through this device, to this next hop,
 * whose link-layer address sent the frame? (gateway 0: the next hop is addr) */
static __always_inline int routed_back(struct __sk_buff *skb, __be32 addr, __be32 local,
				       __be32 gateway, struct ethhdr *eth)
{
	struct bpf_fib_lookup fib = {};
	int i;

	fib.family = SL_AF_INET;
	fib.ifindex = skb->ifindex;
	fib.ipv4_src = local;
	fib.ipv4_dst = addr;
	if (bpf_fib_lookup(skb, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;	/* no route, not forwarded, or the neighbour unresolved */
	if (fib.ifindex != skb->ifindex)
		return 0;
	if (fib.ipv4_dst != (gateway ? gateway : addr))
		return 0;	/* the lookup leaves the next hop in ipv4_dst */
#pragma unroll
	for (i = 0; i < ETH_ALEN; i++)
		if (fib.dmac[i] != eth->h_source[i])
			return 0;
	return 1;
}

static __always_inline struct sl_pod_range *range_of(__be32 addr)
{
	struct sl_peer_key key = { .prefixlen = 32, .addr = addr };

	return pod_ranges.lookup(&key);
}

static __always_inline int judge_tunnel(struct __sk_buff *skb, struct ethhdr *eth,
					struct sl_packet *pkt, __u32 vni)
{
	__u32 off = pkt->l4 + SL_UDP_HLEN;
	struct sl_pod_range *range;
	struct ethhdr inner_eth;
	struct sl_vxlan vx;
	__be32 inner_src;

	if (!tunnel_peers.lookup(&pkt->flow.saddr) ||
	    !routed_back(skb, pkt->flow.saddr, pkt->flow.daddr, 0, eth))
		goto forged;
	if (bpf_skb_load_bytes(skb, off, &vx, sizeof(vx)) < 0 ||
	    !(vx.flags & SL_VXLAN_FLAG_VNI) || (bpf_ntohl(vx.vni_reserved) >> 8) != vni)
		goto forged;
	off += SL_VXLAN_HLEN;
	if (bpf_skb_load_bytes(skb, off, &inner_eth, sizeof(inner_eth)) < 0 ||
	    inner_eth.h_proto != bpf_htons(ETH_P_IP))
		goto forged;
	off += SL_ETH_HLEN + __builtin_offsetof(struct iphdr, saddr);
	if (bpf_skb_load_bytes(skb, off, &inner_src, sizeof(inner_src)) < 0)
		goto forged;
	if (inner_src == pkt->flow.saddr)
		return verdict_pass(SL_DIR_NETWORK, SL_ALLOWED);	/* the peer's own address */
	range = range_of(inner_src);
	if (!range || range->flags || range->node != pkt->flow.saddr)
		goto forged;
	return verdict_pass(SL_DIR_NETWORK, SL_ALLOWED);
forged:
	return verdict_drop(0, SL_DIR_NETWORK, SL_DROP_TUNNEL_PEER, &pkt->flow);
}

static __always_inline int judge_from_network(struct __sk_buff *skb)
{
	struct sl_pod_range *range;
	struct sl_packet pkt = {};
	struct sl_config *cfg;
	struct ethhdr eth;
	__u32 zero = 0;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0 || eth.h_proto != bpf_htons(ETH_P_IP))
		return SL_PASS;	/* not IPv4: no pod source to check (the pods are IPv4) */
	if (parse_ipv4(skb, SL_ETH_HLEN, &pkt) < 0)
		return SL_PASS;	/* the node's stack drops what does not parse */
	/* A later fragment is only ever put together with its first one, judged here. */
	if (pkt.fragment == SL_FRAG_LATER)
		return SL_PASS;
	cfg = config.lookup(&zero);
	if (cfg && cfg->tunnel_port && pkt.flow.proto == IPPROTO_UDP &&
	    pkt.flow.dport == cfg->tunnel_port)
		return judge_tunnel(skb, &eth, &pkt, cfg->tunnel_vni);
	range = range_of(pkt.flow.saddr);
	if (!range)
		return SL_PASS;
	if (range->flags || !routed_back(skb, pkt.flow.saddr, pkt.flow.daddr, range->node, &eth))
		return verdict_drop(0, SL_DIR_NETWORK, SL_DROP_FORGED_SOURCE, &pkt.flow);
	return verdict_pass(SL_DIR_NETWORK, SL_ALLOWED);
}

#endif /* __SL_NETWORK_H__ */
