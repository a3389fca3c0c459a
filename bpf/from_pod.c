/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Attached to clsact ingress of a pod's node-side veth: every packet the
 * pod sends. Enforces the pod's egress policy and its source address.
 */
#include "flow.h"

int from_pod(struct __sk_buff *skb)
{
	return handle_packet(skb, SL_DIR_EGRESS);
}
