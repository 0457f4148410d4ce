// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Decapsulation on the reals (this kernel has no ipip module): strip the balancer's
 * outer IPv4 (protocol IPIP) or IPv6 (next header IPv6 or IPIP) header and hand the
 * inner packet to the stack, which answers the client directly (direct server return;
 * the VIP is configured on the real's loopback). Everything else passes untouched.
 */
#include "nl_common.h"
#include <linux/ip.h>
#include <linux/ipv6.h>
#include "lb_consts.h"

/* Packets decapsulated, per CPU: [0] IPv4 outer, [1] IPv6 outer. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} decap_stats SEC(".maps");

static __always_inline int strip(struct xdp_md *ctx, int outer_len, __u16 inner_proto_be, __u32 stat)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr eth_copy;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	__builtin_memcpy(&eth_copy, eth, sizeof(eth_copy));
	if (bpf_xdp_adjust_head(ctx, outer_len))
		return XDP_PASS;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(eth->h_dest, eth_copy.h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth_copy.h_source, ETH_ALEN);
	eth->h_proto = inner_proto_be;

	__u64 *v = bpf_map_lookup_elem(&decap_stats, &stat);
	if (v)
		*v += 1;
	return XDP_PASS;
}

SEC("xdp")
int decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == ETH_P_IP_BE) {
		struct iphdr *iph = (void *)(eth + 1);

		if ((void *)(iph + 1) > data_end || iph->ihl != 5 || iph->protocol != IPPROTO_IPIP_)
			return XDP_PASS;
		return strip(ctx, sizeof(struct iphdr), ETH_P_IP_BE, 0);
	}
	if (eth->h_proto == ETH_P_IPV6_BE) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		if (ip6->nexthdr == IPPROTO_IPV6_)
			return strip(ctx, sizeof(struct ipv6hdr), ETH_P_IPV6_BE, 1);
		if (ip6->nexthdr == IPPROTO_IPIP_)
			return strip(ctx, sizeof(struct ipv6hdr), ETH_P_IP_BE, 1);
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
