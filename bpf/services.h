/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Egress through Services, judged after kube-proxy's DNAT.
 *
 * API:
 *   int judge_source(self, pkt)     0 to go on, or TC_ACT_SHOT (counted)
 *   int services_judged()           is after_nat.c on netfilter's hooks
 *
 * The from-pod program runs before kube-proxy's DNAT: a new flow of an
 * egress-isolated pod to a ClusterIP (service_ips) is not judged there; it
 * gets a conntrack entry marked SL_CT_SERVICE and passes, and only while
 * after_nat.c is on netfilter's FORWARD and LOCAL_IN hooks (else it is
 * dropped: drop-unjudged). After DNAT the flow meets the datapath with the
 * backend's address and target port, and still the pod's source: on those
 * hooks, whatever device it will leave by and before any masquerading, or
 * on a node address (a hostNetwork backend); and again on the backend's veth
 * (to-pod) or the node's uplink (uplink.c). There, a packet whose source is
 * a local endpoint (ep_by_ip; from-pod drops spoofed sources, so the source
 * is trustworthy) with isolated egress, and whose flow the source's
 * conntrack does not hold, is judged by the SOURCE's egress policy:
 * allowed, it gets an SL_CT_POST_DNAT entry in the source's outbound table
 * (later packets pass by it, and a tightened policy cuts it on its next
 * packet); denied, it is dropped and counted as the source's egress denial.
 * Flows the source's conntrack holds otherwise were judged where the pod
 * sent them (or are replies of flows it accepted) and go on.
 */
#ifndef __SL_SERVICES_H__
#define __SL_SERVICES_H__

#include "conntrack.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "verdict.h"

static __always_inline int judge_source(__u32 self, struct sl_packet *pkt)
{
	struct sl_endpoint *src;
	struct sl_ct_entry *e;
	struct sl_ct_key k;
	struct sl_ct_shares ct;
	__u32 *found, owner;
	void *table;
	int reply = 0;

	if (pkt->fragment == SL_FRAG_LATER || pkt->icmp_error)
		return 0;
	found = ep_by_ip.lookup(&pkt->flow.saddr);
	if (!found)
		return 0;
	owner = *found;
	if (owner == self)
		return 0;	/* a pod may always reach itself */
	src = endpoints.lookup(&owner);
	if (!src || src->egress_policy == SL_NONE)
		return 0;
	if (!ct_shares(src, SL_DIR_EGRESS, &ct))
		return 0;
	/* The packet leaves src: a flow src opened, or a reply to one opened toward it. */
	e = ct_find(&ct, SL_DIR_EGRESS, owner, &pkt->flow, &k, &reply);
	table = ct_share(&ct, reply ? SL_DIR_INGRESS : SL_DIR_EGRESS);
	if (e && (e->flags & SL_CT_POST_DNAT) && ct_is_syn(pkt) && ct_is_closing(e)) {
		ct_remove(table, owner, &k);	/* a new flow reusing the 5-tuple */
		e = 0;
	}
	if (e) {
		if (!(e->flags & SL_CT_POST_DNAT))
			return 0;
		if (e->policy_gen != src->policy_gen) {
			if (!policy_allows(src->egress_policy, k.daddr, k.proto, k.dport)) {
				ct_remove(table, owner, &k);
				return verdict_drop(owner, SL_DIR_EGRESS, SL_DROP_FLOW_CUT,
						    &pkt->flow);
			}
			e->policy_gen = src->policy_gen;
		}
		ct_touch(e, reply, pkt->tcp_flags);
		return 0;
	}
	if (!policy_allows(src->egress_policy, pkt->flow.daddr, pkt->flow.proto, pkt->flow.dport))
		return verdict_drop(owner, SL_DIR_EGRESS, SL_DENIED_POLICY, &pkt->flow);
	if (ct_creates(pkt))
		ct_create(ct_share(&ct, SL_DIR_EGRESS), owner, &pkt->flow, src->policy_gen, SL_DIR_EGRESS,
			  SL_CT_POST_DNAT);
	return 0;
}

/* Is after_nat.c on netfilter's hooks, judging flows to ClusterIPs after DNAT? */
static __always_inline int services_judged(void)
{
	__u32 zero = 0;
	struct sl_config *cfg = config.lookup(&zero);

	return cfg && cfg->after_nat;
}

#endif /* __SL_SERVICES_H__ */
