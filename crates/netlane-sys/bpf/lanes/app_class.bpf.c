// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Per-application egress classes: a tc program on an interface's egress (TCX) that
 * maps a packet's mark (set on every socket of an application by app_sock.bpf.c) to
 * the application's class of the interface's htb qdisc. It writes the class id
 * (major:minor) to skb->priority, which htb reads before any filter: a priority that
 * names one of its leaf classes puts the packet in that class. TCX egress runs before
 * the qdisc, so no filter on the htb itself is needed.
 *
 * This is the stand-in for mqprio's channel mode, which this kernel lacks: the class
 * table is a hash map, so the number of applications is not limited to mqprio's 16
 * traffic classes. Packets without a known mark keep their priority and go to htb's
 * default class.
 */
#include "nl_common.h"

#define TCX_NEXT -1

#ifndef MAX_APPS
#define MAX_APPS 4096
#endif

/* Mark -> htb class id (major << 16 | minor). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_APPS);
	__type(key, __u32);
	__type(value, __u32);
} app_classes SEC(".maps");

#define STAT_CLASSIFIED 0
#define STAT_OTHER 1

/* Packets put in an application's class, and packets left alone. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} app_class_stats SEC(".maps");

SEC("tc")
int app_class(struct __sk_buff *skb)
{
	__u32 mark = skb->mark;
	__u32 *classid;

	if (!mark) {
		nl_count(&app_class_stats, STAT_OTHER);
		return TCX_NEXT;
	}
	classid = bpf_map_lookup_elem(&app_classes, &mark);
	if (!classid) {
		nl_count(&app_class_stats, STAT_OTHER);
		return TCX_NEXT;
	}
	skb->priority = *classid;
	nl_count(&app_class_stats, STAT_CLASSIFIED);
	return TCX_NEXT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
