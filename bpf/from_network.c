/* SPDX-License-Identifier: GPL-2.0 */
/*
 * On tcx ingress of the node's uplinks (clsact ingress on kernels without
 * tcx) and of its tunnel device: everything the node receives from its
 * network. A packet that claims a pod's source must come from the node that
 * holds that pod, and the tunnel carries only what its peers send (network.h).
 */
#include "network.h"

int from_network(struct __sk_buff *skb)
{
	return judge_from_network(skb);
}
