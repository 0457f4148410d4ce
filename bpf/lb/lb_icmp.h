/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP for VIPs: echo requests to a VIP address are answered by the balancer itself
 * (XDP_TX), as a VIP has no host of its own to answer them. */
#ifndef LB_ICMP_H
#define LB_ICMP_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#include "lb_consts.h"

/* RFC 1624 incremental update of a one's-complement checksum when a 16-bit word
 * changes from `old` to `new` (all in network order). */
static __always_inline __u16 csum_replace(__u16 check, __u16 old, __u16 new)
{
	__u32 sum = (__u16)~check + (__u16)~old + new;

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

static __always_inline void swap_macs(struct ethhdr *eth)
{
	unsigned char tmp[ETH_ALEN];

	__builtin_memcpy(tmp, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, tmp, ETH_ALEN);
}

/* Turns an ICMP/ICMPv6 echo request into its reply in place. Returns 0 when it did,
 * -1 when the packet is not an echo request (or is truncated). Swapping source and
 * destination leaves the IPv4 header checksum and the ICMPv6 pseudo-header sum as
 * they were; only the type changes. */
static __always_inline int icmp_echo_reply(void *data, void *data_end, __u8 family)
{
	struct ethhdr *eth = data;

	if (family == FAM_V4) {
		struct iphdr *iph = (void *)(eth + 1);
		__u8 *icmp = (void *)(iph + 1);
		__u32 tmp;

		if ((void *)(icmp + 4) > data_end || icmp[0] != ICMP_ECHO_ || icmp[1] != 0)
			return -1;
		icmp[0] = ICMP_ECHOREPLY_;
		*(__u16 *)(icmp + 2) = csum_replace(*(__u16 *)(icmp + 2), bpf_htons(ICMP_ECHO_ << 8),
						    bpf_htons(ICMP_ECHOREPLY_ << 8));
		tmp = iph->saddr;
		iph->saddr = iph->daddr;
		iph->daddr = tmp;
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		__u8 *icmp = (void *)(ip6 + 1);
		struct in6_addr tmp;

		if ((void *)(icmp + 4) > data_end || icmp[0] != ICMPV6_ECHO_ || icmp[1] != 0)
			return -1;
		icmp[0] = ICMPV6_ECHOREPLY_;
		*(__u16 *)(icmp + 2) = csum_replace(*(__u16 *)(icmp + 2), bpf_htons(ICMPV6_ECHO_ << 8),
						    bpf_htons(ICMPV6_ECHOREPLY_ << 8));
		tmp = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = tmp;
	}
	swap_macs(eth);
	return 0;
}

#endif /* LB_ICMP_H */
