/* SPDX-License-Identifier: GPL-2.0 */
/*
 * On tcx egress of the node's uplink interfaces (clsact egress on kernels
 * without tcx): packets leaving the node, after netfilter. A packet from a
 * local egress-isolated pod whose flow that pod's conntrack does not hold
 * (a flow to a ClusterIP whose backend is on another node) is judged by
 * the pod's egress policy on the backend's address and port (services.h).
 * Everything else (the node's own traffic, replies, flows judged when the
 * pod sent them) passes. The uplink must be an Ethernet device.
 */
#include "services.h"

int uplink(struct __sk_buff *skb)
{
	struct sl_packet pkt = {};
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0 ||
	    eth.h_proto != bpf_htons(ETH_P_IP))
		return SL_PASS;
	if (parse_ipv4(skb, SL_ETH_HLEN, &pkt) < 0)
		return SL_PASS;
	return judge_source(0, &pkt) ? TC_ACT_SHOT : SL_PASS;
}
