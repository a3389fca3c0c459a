/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Packet parsing for the endpoint programs.
 *
 * API:
 *   int parse_ipv4(skb, struct sl_packet *pkt)  0, or a negative SL_DROP_* reason
 *
 * IPv4 options are skipped by the header length, so ports are read where
 * they are. Non-first fragments carry no transport header and are marked
 * so; an ICMP error carries the flow it reports on in pkt->inner.
 */
#ifndef __SL_PARSE_H__
#define __SL_PARSE_H__

#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#include "sluice.h"

#define SL_FRAG_NONE	0
#define SL_FRAG_FIRST	1	/* offset 0, more to come: has the transport header */
#define SL_FRAG_LATER	2	/* no transport header */

#define IP_MF		0x2000
#define IP_OFFSET	0x1fff

struct sl_tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
};

struct sl_packet {
	struct sl_tuple flow;
	struct sl_tuple inner;	/* valid when icmp_error */
	__be16 ip_id;
	__u8 fragment;
	__u8 icmp_error;
	__u8 tcp_flags;		/* TH_* bits of byte 13 of the TCP header */
};

#define SL_TCP_FIN	0x01
#define SL_TCP_SYN	0x02
#define SL_TCP_RST	0x04

/* Ports of the transport header at l4 (TCP, UDP and SCTP start alike). */
static __always_inline int parse_ports(void *l4, void *data_end, __u8 proto,
				       struct sl_tuple *t, __u8 *tcp_flags)
{
	switch (proto) {
	case IPPROTO_TCP:
		if (l4 + 14 > data_end)
			return -SL_DROP_MALFORMED;
		if (tcp_flags)
			*tcp_flags = *((__u8 *)l4 + 13);
		/* fallthrough */
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		if (l4 + 4 > data_end)
			return -SL_DROP_MALFORMED;
		t->sport = ((__be16 *)l4)[0];
		t->dport = ((__be16 *)l4)[1];
		return 0;
	case IPPROTO_ICMP: {
		struct icmphdr *icmp = l4;

		if ((void *)(icmp + 1) > data_end)
			return -SL_DROP_MALFORMED;
		if (icmp->type == ICMP_ECHO || icmp->type == ICMP_ECHOREPLY) {
			/* The identifier names the flow both ways. */
			t->sport = icmp->un.echo.id;
			t->dport = icmp->un.echo.id;
		}
		return 0;
	}
	default:
		return 0;
	}
}

static __always_inline int is_icmp_error(__u8 type)
{
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED ||
	       type == ICMP_PARAMETERPROB || type == ICMP_SOURCE_QUENCH;
}

/* The IPv4 header and first 8 bytes an ICMP error quotes. */
static __always_inline int parse_icmp_inner(void *icmp, void *data_end, struct sl_tuple *inner)
{
	struct iphdr *ip = icmp + sizeof(struct icmphdr);
	__u32 ihl;

	if ((void *)(ip + 1) > data_end)
		return -SL_DROP_MALFORMED;
	ihl = ip->ihl & 0xf;
	if (ip->version != 4 || ihl < 5)
		return -SL_DROP_MALFORMED;
	inner->saddr = ip->saddr;
	inner->daddr = ip->daddr;
	inner->proto = ip->protocol;
	return parse_ports((void *)ip + ihl * 4, data_end, ip->protocol, inner, 0);
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct sl_packet *pkt)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u16 frag;
	__u32 ihl;
	void *l4;

	if ((void *)(ip + 1) > data_end)
		return -SL_DROP_MALFORMED;
	ihl = ip->ihl & 0xf;
	if (ip->version != 4 || ihl < 5)
		return -SL_DROP_MALFORMED;
	l4 = (void *)ip + ihl * 4;
	if (l4 > data_end)
		return -SL_DROP_MALFORMED;

	pkt->flow.saddr = ip->saddr;
	pkt->flow.daddr = ip->daddr;
	pkt->flow.proto = ip->protocol;
	pkt->ip_id = ip->id;

	frag = bpf_ntohs(ip->frag_off);
	if (frag & IP_OFFSET) {
		pkt->fragment = SL_FRAG_LATER;
		return 0;
	}
	if (frag & IP_MF)
		pkt->fragment = SL_FRAG_FIRST;

	if (parse_ports(l4, data_end, ip->protocol, &pkt->flow, &pkt->tcp_flags) < 0)
		return -SL_DROP_MALFORMED;
	if (ip->protocol == IPPROTO_ICMP) {
		struct icmphdr *icmp = l4;

		if ((void *)(icmp + 1) > data_end)
			return -SL_DROP_MALFORMED;
		if (is_icmp_error(icmp->type)) {
			pkt->icmp_error = 1;
			if (parse_icmp_inner(l4, data_end, &pkt->inner) < 0)
				return -SL_DROP_MALFORMED;
		}
	}
	return 0;
}

#endif /* __SL_PARSE_H__ */
