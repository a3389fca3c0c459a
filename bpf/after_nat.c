/* SPDX-License-Identifier: GPL-2.0 */
/*
 * On netfilter's FORWARD and LOCAL_IN hooks (IPv4): every packet the node
 * routes or takes for itself, after kube-proxy's DNAT (PREROUTING) and
 * before any masquerading (POSTROUTING). A flow from a local egress-isolated
 * pod to a ClusterIP shows here with the backend's address and port and
 * still the pod's source, whatever device it leaves by (any uplink, the
 * tunnel, a pod's veth) and when its backend is the node itself (a
 * hostNetwork pod, the API server): judged by the pod's egress policy
 * (services.h). Everything else passes: a packet whose source is no local
 * egress-isolated pod, a reply of a connection netfilter tracks, or a packet
 * whose flow the pod's conntrack holds already.
 * A packet from such a pod whose headers cannot be read is dropped.
 */
#include "services.h"
#include "skb.h"

#define SL_NF_DROP	0
#define SL_NF_ACCEPT	1
#define SL_NF_INET_FORWARD	2

/* struct bpf_nf_ctx: the hook's state, then the packet. */
struct sl_nf_ctx {
	const void *state;
	void *skb;
};

int after_nat(struct sl_nf_ctx *ctx)
{
	struct sl_packet pkt = {};
	struct sl_endpoint *src;
	__u32 *owner, self = 0;
	__be32 saddr;

	/* A reply of a connection netfilter tracks answers a flow that was judged
	 * where it was opened (one read: half of most flows' packets). Its
	 * addresses here are half translated (a SNAT is undone before this hook,
	 * a DNAT after it), so no conntrack key of the pod's would name it: the
	 * node's own connection to a ClusterIP, a NodePort's client, masqueraded
	 * by kube-proxy, reach an egress-isolated pod so. */
	if (kernel_skb_is_nat_reply(ctx->skb))
		return SL_NF_ACCEPT;
	/* Most other packets are no egress-isolated pod's: three reads and a
	 * lookup. A packet whose source cannot be read names no pod (from_pod
	 * read it). */
	if (kernel_skb_saddr(ctx->skb, &saddr) < 0)
		return SL_NF_ACCEPT;
	owner = ep_by_ip.lookup(&saddr);
	src = owner ? endpoints.lookup(owner) : 0;
	if (!src || src->egress_policy == SL_NONE)
		return SL_NF_ACCEPT;
	if (parse_kernel_skb(ctx->skb, &pkt) < 0) {
		verdict_drop(*owner, SL_DIR_EGRESS, SL_DROP_MALFORMED, &pkt.flow);
		return SL_NF_DROP;
	}
	/* Still addressed to a service address when the node forwards it: no DNAT
	 * translated it (a port the Service does not have, a "reply" of a
	 * connection netfilter never NATed), and it would leave toward that
	 * address with the deferred verdict from_pod gave it. Refused. On
	 * LOCAL_IN, IPVS translates after this hook; the backend's veth or the
	 * uplink judges that flow. */
	if (kernel_hook(ctx->state) == SL_NF_INET_FORWARD && service_ips.lookup(&pkt.flow.daddr)) {
		verdict_drop(*owner, SL_DIR_EGRESS, SL_DROP_UNJUDGED, &pkt.flow);
		return SL_NF_DROP;
	}
	/* A pod reaching itself through its Service is never judged. */
	owner = ep_by_ip.lookup(&pkt.flow.daddr);
	if (owner)
		self = *owner;
	return judge_source(self, &pkt) ? SL_NF_DROP : SL_NF_ACCEPT;
}
