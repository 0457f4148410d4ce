// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Lanes without an acceptor: the SO_REUSEPORT group's selector.
 *
 * A server with one listening (or UDP) socket per lane, all in one SO_REUSEPORT group,
 * attaches this program with SO_ATTACH_REUSEPORT_EBPF. For each new connection's SYN
 * (or each datagram) the kernel runs it and gives the packet to the socket whose index
 * in the group it returns (sockets are numbered in the order they joined: listen(2) for
 * TCP, bind(2) for UDP; socket(7)). The index comes from `napi_lane`, keyed by the NAPI
 * id the packet arrived through, which user space fills from its lane map; a packet
 * from an unknown NAPI instance (or none: id 0) gets an index past the group's end, and
 * the kernel falls back to its own hash. `napi_stats` counts both.
 */
#include "nl_common.h"

/* Most NAPI ids a group steers. */
#ifndef MAX_NAPI_IDS
#define MAX_NAPI_IDS 4096
#endif

/* NAPI id -> socket index in the reuseport group. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NAPI_IDS);
	__type(key, __u32);
	__type(value, __u32);
} napi_lane SEC(".maps");

#define STAT_BY_NAPI 0
#define STAT_FALLBACK 1

/* Packets steered by their NAPI id, and left to the kernel's hash. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} napi_stats SEC(".maps");

SEC("socket")
int reuseport_napi(struct __sk_buff *skb)
{
	__u32 napi_id = skb->napi_id;
	__u32 *index = bpf_map_lookup_elem(&napi_lane, &napi_id);

	if (!index) {
		nl_count(&napi_stats, STAT_FALLBACK);
		/* Past any group's end: the kernel picks by its hash. */
		return 0xffffffff;
	}
	nl_count(&napi_stats, STAT_BY_NAPI);
	return *index;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
