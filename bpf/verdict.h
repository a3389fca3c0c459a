/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The single exit of the datapath programs: count the verdict per CPU and,
 * for a drop, send a rate-limited event to userspace.
 *
 * API:
 *   int verdict_pass(dir, reason)                      SL_PASS
 *   int verdict_drop(ifindex, dir, reason, tuple)      TC_ACT_SHOT (tuple may be NULL)
 *
 * A pass is "next" (TCX_NEXT, TC_ACT_UNSPEC: both -1), not "ok": later
 * programs on the hook (tcx) or filters (clsact) still run, such as the
 * bandwidth plugin's; with none left the packet goes on. The ifindex of a
 * drop names the endpoint whose policy decided (after DNAT: the source's).
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

static __always_inline int verdict_drop(__u32 ifindex, __u32 dir, __u32 reason,
					struct sl_tuple *t)
{
	struct sl_event ev = {};

	count(dir, reason);
	if (!event_allowed())
		return TC_ACT_SHOT;
	ev.timestamp = bpf_ktime_get_ns();
	ev.ifindex = ifindex;
	ev.dir = dir;
	ev.reason = reason;
	if (t) {
		ev.saddr = t->saddr;
		ev.daddr = t->daddr;
		ev.sport = t->sport;
		ev.dport = t->dport;
		ev.proto = t->proto;
	}
	events.ringbuf_output(&ev, sizeof(ev), 0);
	return TC_ACT_SHOT;
}

#endif /* __SL_VERDICT_H__ */
