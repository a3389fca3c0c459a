/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The datapath's vocabulary, declared once for C: the direction axis and
 * the reasons every packet is counted under. cni/datapath/vocabulary.py
 * declares the same values for Python; a test parses this file and compares.
 *
 * API: SL_DIR_* (a packet's direction), SL_* reasons, SL_DIRS, SL_REASONS.
 */
#ifndef __SL_VOCABULARY_H__
#define __SL_VOCABULARY_H__

/* Directions, from the pod's point of view; each names one hook. The node's
 * network is a third way in: what its uplinks receive (tcx ingress). */
#define SL_DIR_EGRESS		0	/* from the pod: its egress; tcx ingress of the node-side veth */
#define SL_DIR_INGRESS		1	/* to the pod: its ingress; tcx egress of the node-side veth */
#define SL_DIR_NETWORK		2	/* from the node network: tcx ingress of an uplink */
#define SL_DIRS			3

/* Reasons: counters are indexed by direction * SL_REASONS + reason. */
#define SL_ALLOWED		0	/* passed: a new flow a rule allows, or a packet of a known flow */
#define SL_ALLOWED_REPLY	1	/* passed as the reply of an allowed flow */
#define SL_DENIED_POLICY	2	/* no rule allows it */
#define SL_DROP_SPOOFED		3	/* source is not one of the pod's addresses */
#define SL_DROP_FRAGMENT	4	/* a later fragment whose first fragment was not allowed */
#define SL_DROP_MALFORMED	5	/* truncated or invalid headers */
#define SL_DROP_UNSUPPORTED	6	/* a frame policy cannot judge: IPv6, VLAN tags, other ethertypes */
#define SL_DROP_NO_ENDPOINT	7	/* the veth has no endpoint entry or conntrack table */
#define SL_DROP_FLOW_CUT	8	/* a known flow the endpoint's new policy denies */
#define SL_ALLOWED_RELATED	9	/* an ICMP error about a flow the endpoint tracks */
#define SL_DROP_ICMP_ERROR	10	/* an ICMP error that is too long, forged, or about no tracked flow */
#define SL_DEFERRED_SERVICE	11	/* a new flow to a ClusterIP: judged after DNAT, on the backend */
#define SL_DROP_TUNNEL_PORT	12	/* from a pod to the tunnel's UDP port */
#define SL_DROP_TUNNEL_PEER	13	/* on the tunnel port: not from a peer node, or an inner source
					 * outside that peer's pod ranges */
#define SL_DROP_FORGED_SOURCE	14	/* from the node network with a pod's source, not from the
					 * node that holds it */
#define SL_DROP_UNJUDGED	15	/* to a ClusterIP while nothing judges flows after DNAT */
#define SL_REASONS		16

#endif /* __SL_VOCABULARY_H__ */
