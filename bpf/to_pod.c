/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Attached to clsact egress of a pod's node-side veth: every packet on its
 * way into the pod. Enforces the pod's ingress policy.
 */
#include "flow.h"

int to_pod(struct __sk_buff *skb)
{
	return handle_packet(skb, SL_DIR_INGRESS);
}
