// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The datagram request/response service's AF_XDP steering program.
 *
 * UDP datagrams for the service, exactly those its own socket would receive
 * (`service_port` on the destinations below; IPv4 without fragmentation, or IPv6 with
 * UDP as the first next header), are redirected to the AF_XDP socket of the queue they
 * arrived on (`xsks`, indexed by rx_queue_index); when that queue has no socket the
 * redirect falls back to XDP_PASS. Everything else passes to the stack untouched:
 * other sockets, tcpdump, ARP and neighbour discovery keep working. `xsk_stats` counts
 * both outcomes.
 */
#include "nl_common.h"
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>

/* Host order; set by the loader. */
const volatile __u16 service_port = 0;
/* Which destinations are the service's, set by the loader: a family is taken when its
 * take_* is set, and then only the address in *_dst (network order) when *_exact is. */
const volatile __u8 take_v4 = 0;
const volatile __u8 v4_exact = 0;
const volatile __u32 v4_dst = 0;
const volatile __u8 take_v6 = 0;
const volatile __u8 v6_exact = 0;
const volatile __u32 v6_dst[4] = {};
/* The interface's MAC: a unicast frame for another (promiscuous mode) is not the
 * service's, whatever its addresses; the stack drops it. Unset (all zero): no check. */
const volatile __u8 own_mac[6] = {};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

#define STAT_REDIRECTED 0
#define STAT_PASSED 1

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} xsk_stats SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&xsk_stats, &which);

	if (v)
		*v += 1;
}

static __always_inline int pass(void)
{
	count(STAT_PASSED);
	return XDP_PASS;
}

static __always_inline int for_another_host(const struct ethhdr *eth)
{
	const __u8 *d = eth->h_dest;

	if (!(own_mac[0] | own_mac[1] | own_mac[2] | own_mac[3] | own_mac[4] | own_mac[5]))
		return 0;
	/* Group addresses (broadcast, multicast) are for every host. */
	if (d[0] & 1)
		return 0;
	return d[0] != own_mac[0] || d[1] != own_mac[1] || d[2] != own_mac[2] || d[3] != own_mac[3] ||
	       d[4] != own_mac[4] || d[5] != own_mac[5];
}

static __always_inline int is_v6_dst(const struct ipv6hdr *ip6)
{
	const __u32 *a = ip6->daddr.in6_u.u6_addr32;

	return a[0] == v6_dst[0] && a[1] == v6_dst[1] && a[2] == v6_dst[2] && a[3] == v6_dst[3];
}

SEC("xdp")
int xsk_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct udphdr *udp;

	if ((void *)(eth + 1) > end || for_another_host(eth))
		return pass();
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if (!take_v4 || (void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP || ip->ihl < 5)
			return pass();
		if (v4_exact && ip->daddr != v4_dst)
			return pass();
		/* Fragments go to the stack, which reassembles them. */
		if (ip->frag_off & bpf_htons(0x3fff))
			return pass();
		udp = (void *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if (!take_v6 || (void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_UDP)
			return pass();
		if (v6_exact && !is_v6_dst(ip6))
			return pass();
		udp = (void *)(ip6 + 1);
	} else {
		return pass();
	}
	if ((void *)(udp + 1) > end || udp->dest != bpf_htons(service_port))
		return pass();
	count(STAT_REDIRECTED);
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
