/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Packet parsing for the datapath programs.
 *
 * API:
 *   int parse_ipv4(skb, l3, struct sl_packet *pkt)  0, or a negative SL_* reason
 *
 * Headers are read with bpf_skb_load_bytes, so packets whose headers are
 * not in the linear part of the skb (GRO, decapsulated traffic, pods that
 * route, AF_PACKET senders) are parsed like any other, never dropped as
 * malformed. IPv4 options are skipped by the header length, so ports are
 * read where they are. Non-first fragments carry no transport header and
 * are marked so. An ICMP error carries the packet it reports on in
 * pkt->inner: its IPv4 header and the 8 bytes of transport header RFC 792
 * requires (ports, or an echo's identifier), nothing more.
 */
#ifndef __SL_PARSE_H__
#define __SL_PARSE_H__

#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/icmp.h>

#include "sluice.h"

#define SL_FRAG_NONE		0
#define SL_FRAG_FIRST		1	/* offset 0, more to come: has the transport header */
#define SL_FRAG_LATER		2	/* no transport header */

#define SL_IP_MF		0x2000
#define SL_IP_OFFSET		0x1fff
#define SL_ETH_HLEN		14
#define SL_ICMP_HLEN		8
#define SL_ICMP_QUOTE_L4	8	/* transport bytes an ICMP error must quote */
#define SL_ICMP_ERROR_MAX	576	/* largest ICMP error a router sends (RFC 1812 4.3.2.3) */

#define SL_TCP_FIN		0x01
#define SL_TCP_SYN		0x02
#define SL_TCP_RST		0x04
#define SL_TCP_ACK		0x10

struct sl_tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;		/* ICMP echo request: the identifier (reply: 0) */
	__be16 dport;		/* ICMP echo reply: the identifier (request: 0) */
	__u8 proto;
};

struct sl_packet {
	struct sl_tuple flow;
	struct sl_tuple inner;	/* valid when icmp_error */
	__u32 tot_len;
	__u32 l4;		/* offset of the transport header */
	__be16 ip_id;
	__u8 fragment;
	__u8 icmp_error;
	__u8 icmp_type;
	__u8 tcp_flags;		/* TH_* bits of byte 13 of the TCP header */
};

/* The transport header at off: ports (TCP, UDP and SCTP start alike), TCP
 * flags, an ICMP type and echo identifier. A quote needs only 8 bytes. */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, __u8 proto,
				    struct sl_tuple *t, struct sl_packet *pkt, int quote)
{
	__u8 l4[14];

	switch (proto) {
	case IPPROTO_TCP:
		if (quote) {
			if (bpf_skb_load_bytes(skb, off, l4, SL_ICMP_QUOTE_L4) < 0)
				return -SL_DROP_MALFORMED;
		} else {
			if (bpf_skb_load_bytes(skb, off, l4, 14) < 0)
				return -SL_DROP_MALFORMED;
			pkt->tcp_flags = l4[13];
		}
		break;
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		if (bpf_skb_load_bytes(skb, off, l4, quote ? SL_ICMP_QUOTE_L4 : 4) < 0)
			return -SL_DROP_MALFORMED;
		break;
	case IPPROTO_ICMP: {
		struct icmphdr icmp;

		if (bpf_skb_load_bytes(skb, off, &icmp, sizeof(icmp)) < 0)
			return -SL_DROP_MALFORMED;
		if (!quote)
			pkt->icmp_type = icmp.type;
		t->sport = 0;
		t->dport = 0;
		/* Keyed so that only an echo reply matches the request it answers. */
		if (icmp.type == ICMP_ECHO)
			t->sport = icmp.un.echo.id;
		else if (icmp.type == ICMP_ECHOREPLY)
			t->dport = icmp.un.echo.id;
		return 0;
	}
	default:
		return 0;
	}
	__builtin_memcpy(&t->sport, &l4[0], 2);
	__builtin_memcpy(&t->dport, &l4[2], 2);
	return 0;
}

static __always_inline int is_icmp_error(__u8 type)
{
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED ||
	       type == ICMP_PARAMETERPROB || type == ICMP_SOURCE_QUENCH;
}

/* The quoted IPv4 header and transport bytes of an ICMP error at off. */
static __always_inline int parse_icmp_inner(struct __sk_buff *skb, __u32 off,
					    struct sl_tuple *inner, struct sl_packet *pkt)
{
	struct iphdr ip;
	__u32 ihl;

	if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0)
		return -SL_DROP_MALFORMED;
	ihl = ip.ihl & 0xf;
	if (ip.version != 4 || ihl < 5)
		return -SL_DROP_MALFORMED;
	if (bpf_ntohs(ip.frag_off) & SL_IP_OFFSET)
		return -SL_DROP_ICMP_ERROR;	/* quotes a later fragment: no flow to name */
	inner->saddr = ip.saddr;
	inner->daddr = ip.daddr;
	inner->proto = ip.protocol;
	return parse_l4(skb, off + ihl * 4, ip.protocol, inner, pkt, 1);
}

/* The IPv4 packet whose header starts at l3. */
static __always_inline int parse_ipv4(struct __sk_buff *skb, __u32 l3, struct sl_packet *pkt)
{
	struct iphdr ip;
	__u32 ihl, l4;
	__u16 frag;
	int err;

	if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)) < 0)
		return -SL_DROP_MALFORMED;
	ihl = ip.ihl & 0xf;
	if (ip.version != 4 || ihl < 5)
		return -SL_DROP_MALFORMED;
	pkt->tot_len = bpf_ntohs(ip.tot_len);
	/* tot_len 0: a GSO packet larger than 64 KiB (BIG TCP). */
	if (pkt->tot_len < ihl * 4 && !(pkt->tot_len == 0 && skb->gso_size))
		return -SL_DROP_MALFORMED;
	if (l3 + pkt->tot_len > skb->len)
		return -SL_DROP_MALFORMED;
	l4 = l3 + ihl * 4;
	pkt->l4 = l4;

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

	err = parse_l4(skb, l4, ip.protocol, &pkt->flow, pkt, 0);
	if (err < 0)
		return err;
	if (ip.protocol == IPPROTO_ICMP && is_icmp_error(pkt->icmp_type)) {
		pkt->icmp_error = 1;
		if (pkt->tot_len > SL_ICMP_ERROR_MAX)
			return -SL_DROP_ICMP_ERROR;
		return parse_icmp_inner(skb, l4 + SL_ICMP_HLEN, &pkt->inner, pkt);
	}
	return 0;
}

#endif /* __SL_PARSE_H__ */
