/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The single exit of the datapath programs: count the verdict per CPU and,
 * for a drop, send a rate-limited event to userspace.
 *
 * API:
 *   int verdict_pass(dir, reason)                          SL_PASS
 *   int verdict_drop(ifindex, dir, reason, tuple)          TC_ACT_SHOT, an IPv4 packet
 *                                                          (tuple may be NULL)
 *   int verdict_drop_frame(ifindex, dir, reason, ethertype) TC_ACT_SHOT, a frame without
 *                                                          a tuple (IPv6, ARP, VLAN...)
 *
 * A pass is "next" (TCX_NEXT, TC_ACT_UNSPEC: both -1), not "ok": later
 * programs on the hook (tcx) or filters (clsact) still run, such as the
 * bandwidth plugin's; with none left the packet goes on. The ifindex of a
 * drop names the endpoint whose policy decided (after DNAT: the source's).
 *
 * An event record is struct sl_event (sluice.h) followed by the frame's
 * EtherType: appended here, outside the headers whose bytes make the pinned
 * maps' layout marker, since the ring buffer's records are no map's key or
 * value (readers of the bare struct sl_event still read the same bytes).
 */
#ifndef __SL_VERDICT_H__
#define __SL_VERDICT_H__

#include <uapi/linux/pkt_cls.h>

#include "maps.h"
#include "parse.h"

#define SL_PASS	(-1)

static __always_inline void count(__u32 dir, __u32 reason)
{
	__u32 index = dir * SL_REASONS + reason;
	__u64 *value = counters.lookup(&index);

	if (value)
		*value += 1;
}

/* Token bucket per CPU: events_per_second, bursts of events_burst. */
static __always_inline int event_allowed(void)
{
	__u32 zero = 0;
	struct sl_config *cfg = config.lookup(&zero);
	struct sl_event_budget *budget = event_budget.lookup(&zero);
	__u64 now, cost, credit;

	if (!cfg || !budget || !cfg->events_per_second)
		return 0;
	now = bpf_ktime_get_ns();
	cost = SL_NSEC_PER_SEC / cfg->events_per_second;
	credit = budget->tokens + (now - budget->last);
	if (credit > cost * cfg->events_burst)
		credit = cost * cfg->events_burst;
	budget->last = now;
	if (credit < cost) {
		budget->tokens = credit;
		return 0;
	}
	budget->tokens = credit - cost;
	return 1;
}

static __always_inline int verdict_pass(__u32 dir, __u32 reason)
{
	count(dir, reason);
	return SL_PASS;
}

struct sl_event_record {
	struct sl_event ev;
	__be16 ethertype;	/* of the frame (ETH_P_IP for every IPv4 packet) */
	__u16 pad[3];
};

static __always_inline int drop(__u32 ifindex, __u32 dir, __u32 reason, struct sl_tuple *t,
				__be16 ethertype)
{
	struct sl_event_record rec = {};

	count(dir, reason);
	if (!event_allowed())
		return TC_ACT_SHOT;
	rec.ev.timestamp = bpf_ktime_get_ns();
	rec.ev.ifindex = ifindex;
	rec.ev.dir = dir;
	rec.ev.reason = reason;
	if (t) {
		rec.ev.saddr = t->saddr;
		rec.ev.daddr = t->daddr;
		rec.ev.sport = t->sport;
		rec.ev.dport = t->dport;
		rec.ev.proto = t->proto;
	}
	rec.ethertype = ethertype;
	events.ringbuf_output(&rec, sizeof(rec), 0);
	return TC_ACT_SHOT;
}

static __always_inline int verdict_drop(__u32 ifindex, __u32 dir, __u32 reason,
					struct sl_tuple *t)
{
	return drop(ifindex, dir, reason, t, bpf_htons(ETH_P_IP));
}

static __always_inline int verdict_drop_frame(__u32 ifindex, __u32 dir, __u32 reason,
					      __be16 ethertype)
{
	return drop(ifindex, dir, reason, 0, ethertype);
}

#endif /* __SL_VERDICT_H__ */
