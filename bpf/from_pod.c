/* SPDX-License-Identifier: GPL-2.0 */
/*
 * On tcx ingress of a pod's node-side veth (clsact ingress on kernels
 * without tcx): every packet the pod sends. Enforces the pod's egress
 * policy, its source addresses, and what may leave a pod at all.
 */
#include "flow.h"

int from_pod(struct __sk_buff *skb)
{
	return handle_packet(skb, SL_DIR_EGRESS);
}
