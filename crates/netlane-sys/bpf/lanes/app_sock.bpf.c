// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Per-application socket policy: attached to an application's cgroup (v2) as a
 * BPF_CGROUP_INET_SOCK_CREATE program, it gives every IPv4 and IPv6 socket a process
 * of that cgroup creates (any thread, any library, no application change) the
 * application's priority (SO_PRIORITY, which mqprio maps to a traffic class) and mark
 * (SO_MARK, which netlane's egress classifier maps to a shaping class).
 *
 * Connections a TCP listener accepts are not created by the process (the kernel clones
 * them from the listener in softirq context) and do not keep the listener's priority:
 * a sock_ops program on the same cgroup gives each the policy once it is established.
 *
 * One instance is loaded per application, its values fixed at load time.
 */
#include "nl_common.h"

/* The application's socket priority and mark. */
const volatile __u32 app_priority = 0;
const volatile __u32 app_mark = 0;

#define SOL_SOCKET 1
#define SO_PRIORITY 12
#define SO_MARK 36

#define STAT_CREATED 0
#define STAT_ACCEPTED 1

/* Sockets given the policy: created, accepted (summed over CPUs by user space). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} app_sock_stats SEC(".maps");

SEC("cgroup/sock_create")
int app_sock(struct bpf_sock *sk)
{
	if (sk->family != 2 /* AF_INET */ && sk->family != 10 /* AF_INET6 */)
		return 1;
	sk->priority = app_priority;
	sk->mark = app_mark;
	nl_count(&app_sock_stats, STAT_CREATED);
	/* 1: the socket may be created. */
	return 1;
}

SEC("sockops")
int app_sockops(struct bpf_sock_ops *skops)
{
	int priority = app_priority;
	int mark = app_mark;

	if (skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	bpf_setsockopt(skops, SOL_SOCKET, SO_PRIORITY, &priority, sizeof(priority));
	bpf_setsockopt(skops, SOL_SOCKET, SO_MARK, &mark, sizeof(mark));
	nl_count(&app_sock_stats, STAT_ACCEPTED);
	return 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
