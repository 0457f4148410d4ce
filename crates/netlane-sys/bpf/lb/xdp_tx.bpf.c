// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The ceiling for the load balancer's packet rate: bounce every Ethernet frame back
 * out of the interface it came in on, MAC addresses swapped (XDP_TX). Anything shorter
 * than an Ethernet header is dropped.
 *
 * `xdp_tx_room` is the same with room made for an outer IPv4 header first
 * (bpf_xdp_adjust_head by 20 bytes, the Ethernet header written again in front, the
 * room zeroed): the least an encapsulating balancer does per packet, for timing
 * programs against. It is a reference, not a forwarder: the room is not a valid
 * header, so it is never attached where frames leave the machine (the lab runs it
 * chained behind its generator, into the loopback device).
 */
#include "nl_common.h"

/* Frames bounced and dropped, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} tx_stats SEC(".maps");

enum {
	STAT_TX = 0,
	STAT_DROP = 1
};

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&tx_stats, &which);

	if (v)
		*v += 1;
}

SEC("xdp")
int xdp_tx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	unsigned char tmp[ETH_ALEN];

	if ((void *)(eth + 1) > data_end) {
		count(STAT_DROP);
		return XDP_DROP;
	}
	__builtin_memcpy(tmp, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, tmp, ETH_ALEN);
	count(STAT_TX);
	return XDP_TX;
}

SEC("xdp")
int xdp_tx_room(struct xdp_md *ctx)
{
	struct ethhdr *eth, old;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (data + sizeof(old) > data_end) {
		count(STAT_DROP);
		return XDP_DROP;
	}
	__builtin_memcpy(&old, data, sizeof(old));
	if (bpf_xdp_adjust_head(ctx, -20)) {
		count(STAT_DROP);
		return XDP_DROP;
	}
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) + 20 > data_end) {
		count(STAT_DROP);
		return XDP_DROP;
	}
	__builtin_memset((void *)(eth + 1), 0, 20);
	__builtin_memcpy(eth->h_dest, old.h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, old.h_dest, ETH_ALEN);
	eth->h_proto = old.h_proto;
	count(STAT_TX);
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
