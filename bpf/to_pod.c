/* SPDX-License-Identifier: GPL-2.0 */
/*
 * On tcx egress of a pod's node-side veth (clsact egress on kernels
 * without tcx): every packet on its way into the pod, after netfilter
 * (kube-proxy's DNAT included). Enforces the pod's ingress policy, and the
 * egress policy of a local source whose flow went through a Service.
 */
#include "flow.h"

int to_pod(struct __sk_buff *skb)
{
	return handle_packet(skb, SL_DIR_INGRESS);
}
