/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP for VIPs: echo requests to a VIP address are answered by the balancer itself
 * (XDP_TX), as a VIP has no host of its own to answer them. "Fragmentation needed" and
 * "packet too big" errors about a VIP's replies are routed to the real that owns the
 * flow, found from the quoted header with source and destination swapped. */
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
		*(__u16 *)(icmp + 2) =
			csum_replace(*(__u16 *)(icmp + 2), bpf_htons(ICMP_ECHO_ << 8), bpf_htons(ICMP_ECHOREPLY_ << 8));
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

/* If the packet is an ICMP frag-needed (IPv4) or ICMPv6 packet-too-big quoting a TCP
 * or UDP packet, fills `f` with the flow it belongs to as the balancer sees that flow
 * (client -> VIP: the quoted packet went VIP -> client) and returns 0; else -1. */
/* icmp_too_big_flow: a too-big message whose quoted headers are cut short. */
#define ICMP_TRUNCATED -2

/* A frag-needed / packet-too-big error: the flow it quotes (turned around: the flow
 * from the client, whose real must get the error) in `f`. 0 for such an error about a
 * TCP or UDP flow; ICMP_TRUNCATED when the message is one but its quoted headers are
 * cut short; -1 for any other message. */
static __always_inline int icmp_too_big_flow(void *data, void *data_end, __u8 family, struct flow_key *f)
{
	struct ethhdr *eth = data;
	__u16 *ports;

	if (family == FAM_V4) {
		struct iphdr *iph = (void *)(eth + 1);
		__u8 *icmp = (void *)(iph + 1);
		struct iphdr *in = (void *)(icmp + 8);

		if ((void *)(icmp + 8) > data_end)
			return ICMP_TRUNCATED;
		if (icmp[0] != ICMP_DEST_UNREACH_ || icmp[1] != ICMP_FRAG_NEEDED_)
			return -1;
		if ((void *)(in + 1) > data_end)
			return ICMP_TRUNCATED;
		if (in->ihl != 5 || (in->protocol != IPPROTO_TCP_ && in->protocol != IPPROTO_UDP_))
			return -1;
		ports = (void *)(in + 1);
		if ((void *)(ports + 2) > data_end)
			return ICMP_TRUNCATED;
		f->src[0] = in->daddr;
		f->dst[0] = in->saddr;
		f->proto = in->protocol;
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		__u8 *icmp = (void *)(ip6 + 1);
		struct ipv6hdr *in = (void *)(icmp + 8);

		if ((void *)(icmp + 8) > data_end)
			return ICMP_TRUNCATED;
		if (icmp[0] != ICMPV6_PKT_TOOBIG_ || icmp[1] != 0)
			return -1;
		if ((void *)(in + 1) > data_end)
			return ICMP_TRUNCATED;
		if (in->nexthdr != IPPROTO_TCP_ && in->nexthdr != IPPROTO_UDP_)
			return -1;
		ports = (void *)(in + 1);
		if ((void *)(ports + 2) > data_end)
			return ICMP_TRUNCATED;
		__builtin_memcpy(f->src, &in->daddr, 16);
		__builtin_memcpy(f->dst, &in->saddr, 16);
		f->proto = in->nexthdr;
	}
	f->sport = ports[1];
	f->dport = ports[0];
	f->family = family;
	return 0;
}

#endif /* LB_ICMP_H */
