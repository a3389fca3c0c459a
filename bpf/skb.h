/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Parsing a kernel struct sk_buff, as a netfilter program gets it.
 *
 * API:
 *   int kernel_skb_saddr(skb, __be32 *saddr)         0, or a negative SL_* reason
 *   int kernel_skb_is_nat_reply(skb)                  a reply of a connection netfilter NATed
 *   int kernel_hook(state)                            the hook (NF_INET_*), or -1
 *   int parse_kernel_skb(skb, struct sl_packet *pkt)  0, or a negative SL_* reason
 *
 * A netfilter program has no bpf_skb_load_bytes: it reads the skb and its
 * headers with bpf_probe_read_kernel (sl_read_kernel). struct sk_buff changes between
 * kernels, and the headers bcc compiles against may be another kernel's,
 * so the offsets of its members are the running kernel's, from its BTF
 * (cni/datapath/btf.py), compiled in as SL_SKB_*. Headers must lie in the
 * skb's linear part (netfilter's NAT and conntrack put them there); a packet
 * whose headers do not is malformed. On FORWARD and LOCAL_IN conntrack has
 * put fragments together; a later fragment is marked so all the same.
 * ICMP errors are marked, not parsed further (nobody judges them here).
 */
#ifndef __SL_SKB_H__
#define __SL_SKB_H__

#include "parse.h"

#ifndef SL_SKB_HEAD
#error "SL_SKB_HEAD, SL_SKB_TAIL, SL_SKB_NETWORK_HEADER: the loader defines them from BTF"
#endif

/* bpf_probe_read_kernel, called by its number: bcc renames that name to the old
 * bpf_probe_read (which netfilter programs may not call) when it does not find
 * the helper in /proc/kallsyms, and a process without CAP_SYSLOG (the
 * DaemonSet's agent) reads every address there as 0. */
static long (*sl_read_kernel)(void *dst, __u32 size, const void *unsafe_ptr) =
	(void *)BPF_FUNC_probe_read_kernel;

/* The IPv4 source alone: three reads, all most packets need (after_nat.c). */
static __always_inline int kernel_skb_saddr(void *skb, __be32 *saddr)
{
	unsigned char *head;
	__u16 nh;

	if (sl_read_kernel(&head, sizeof(head), skb + SL_SKB_HEAD) < 0 ||
	    sl_read_kernel(&nh, sizeof(nh), skb + SL_SKB_NETWORK_HEADER) < 0 ||
	    sl_read_kernel(saddr, sizeof(*saddr),
				  head + nh + __builtin_offsetof(struct iphdr, saddr)) < 0)
		return -SL_DROP_MALFORMED;
	return 0;
}

/* Netfilter's conntrack holds the packet as a reply of a connection it NATed
 * (ctinfo, the low 3 bits of skb->_nfct: IP_CT_IS_REPLY and up; the rest
 * points to the struct nf_conn, whose status has IPS_SRC_NAT or
 * IPS_DST_NAT). A connection nobody NATed proves nothing: a host that sends
 * a packet with a ClusterIP source to a pod makes the pod's packets back
 * "replies" that no DNAT translates. Where nf_conn's layout is unknown
 * (SL_NF_CONN_STATUS -1: conntrack a module), any reply. */
#define SL_NFCT_INFOMASK	7
#define SL_IP_CT_IS_REPLY	3
#define SL_IPS_NAT		((1UL << 4) | (1UL << 5))	/* IPS_SRC_NAT | IPS_DST_NAT */

static __always_inline int kernel_skb_is_nat_reply(void *skb)
{
	unsigned long nfct = 0, status = 0;

	if (sl_read_kernel(&nfct, sizeof(nfct), skb + SL_SKB_NFCT) < 0)
		return 0;
	if (!nfct || (nfct & SL_NFCT_INFOMASK) < SL_IP_CT_IS_REPLY)
		return 0;
	if (SL_NF_CONN_STATUS < 0)
		return 1;
	if (sl_read_kernel(&status, sizeof(status),
			   (void *)(nfct & ~(unsigned long)SL_NFCT_INFOMASK) + SL_NF_CONN_STATUS) < 0)
		return 0;
	return (status & SL_IPS_NAT) != 0;
}

/* The netfilter hook the program runs on (struct nf_hook_state's hook), or -1. */
static __always_inline int kernel_hook(const void *state)
{
	__u8 hook = 0;

	if (SL_NF_HOOK_STATE_HOOK < 0 ||
	    sl_read_kernel(&hook, sizeof(hook), state + SL_NF_HOOK_STATE_HOOK) < 0)
		return -1;
	return hook;
}

static __always_inline int parse_kernel_skb(void *skb, struct sl_packet *pkt)
{
	unsigned char *head;
	struct iphdr ip;
	__u8 l4[14];
	__u32 tail, ihl, l4off, need;
	__u16 nh, frag;

	if (sl_read_kernel(&head, sizeof(head), skb + SL_SKB_HEAD) < 0 ||
	    sl_read_kernel(&tail, sizeof(tail), skb + SL_SKB_TAIL) < 0 ||
	    sl_read_kernel(&nh, sizeof(nh), skb + SL_SKB_NETWORK_HEADER) < 0)
		return -SL_DROP_MALFORMED;
	if ((__u32)nh + sizeof(ip) > tail ||
	    sl_read_kernel(&ip, sizeof(ip), head + nh) < 0)
		return -SL_DROP_MALFORMED;
	ihl = ip.ihl & 0xf;
	if (ip.version != 4 || ihl < 5)
		return -SL_DROP_MALFORMED;
	pkt->flow.saddr = ip.saddr;
	pkt->flow.daddr = ip.daddr;
	pkt->flow.proto = ip.protocol;
	pkt->ip_id = ip.id;
	frag = bpf_ntohs(ip.frag_off);
	if (frag & SL_IP_OFFSET) {
		pkt->fragment = SL_FRAG_LATER;
		return 0;
	}
	if (frag & SL_IP_MF)
		pkt->fragment = SL_FRAG_FIRST;

	switch (ip.protocol) {
	case IPPROTO_TCP:
		need = 14;
		break;
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		need = 4;
		break;
	case IPPROTO_ICMP:
		need = SL_ICMP_HLEN;
		break;
	default:
		return 0;
	}
	l4off = nh + ihl * 4;
	if (l4off + need > tail)
		return -SL_DROP_MALFORMED;
	if (sl_read_kernel(l4, sizeof(l4), head + l4off) < 0)
		return -SL_DROP_MALFORMED;
	if (ip.protocol == IPPROTO_ICMP) {
		struct icmphdr *icmp = (struct icmphdr *)l4;

		pkt->icmp_type = icmp->type;
		if (icmp->type == ICMP_ECHO)
			pkt->flow.sport = icmp->un.echo.id;
		else if (icmp->type == ICMP_ECHOREPLY)
			pkt->flow.dport = icmp->un.echo.id;
		pkt->icmp_error = is_icmp_error(icmp->type);
		return 0;
	}
	__builtin_memcpy(&pkt->flow.sport, &l4[0], 2);
	__builtin_memcpy(&pkt->flow.dport, &l4[2], 2);
	if (ip.protocol == IPPROTO_TCP)
		pkt->tcp_flags = l4[13];
	return 0;
}

#endif /* __SL_SKB_H__ */
