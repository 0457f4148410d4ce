/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: Ethernet, IPv4 (no options, no fragments), IPv6 (no extension
 * headers, no fragments), TCP/UDP ports. Every access is bounds-checked against
 * data_end, and the IP header's length fields are checked against the frame: a packet
 * whose header claims more than the frame carries is malformed (the length the
 * encapsulation writes is then never larger than the frame, so it cannot wrap). */
#ifndef LB_PARSE_H
#define LB_PARSE_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>

#include "lb_consts.h"
#include "lb_structs.h"

/* What the balancer needs from a packet. */
struct pkt_desc {
	struct flow_key flow;
	__u16 l3_len; /* IPv4 total length or IPv6 header + payload, <= the frame */
	__u8 tos;     /* IPv4 TOS or IPv6 traffic class */
	__u8 tcp_flags;
};

enum parse_result {
	PARSE_OK = 0,
	PARSE_NOT_IP,
	PARSE_NOT_L4, /* IP but neither TCP nor UDP */
	PARSE_MALFORMED,
	PARSE_OPTIONS,
	PARSE_FRAGMENT,
};

static __always_inline int parse_l4(void *l4, void *data_end, struct pkt_desc *p)
{
	if (p->flow.proto == IPPROTO_TCP_) {
		struct tcphdr *th = l4;

		if ((void *)(th + 1) > data_end)
			return PARSE_MALFORMED;
		p->flow.sport = th->source;
		p->flow.dport = th->dest;
		p->tcp_flags = ((__u8 *)th)[13];
		return PARSE_OK;
	}
	if (p->flow.proto == IPPROTO_UDP_) {
		struct udphdr *uh = l4;

		if ((void *)(uh + 1) > data_end)
			return PARSE_MALFORMED;
		p->flow.sport = uh->source;
		p->flow.dport = uh->dest;
		return PARSE_OK;
	}
	return PARSE_NOT_L4;
}

/* The Ethernet and IP headers (PARSE_OK with *l4 at the transport header, which is not
 * read), or why not. `frame_len` is the whole frame's length: data_end - data in XDP
 * (one buffer), the skb's length in tc, where data_end ends the linear part only. */
static __always_inline int parse_ip(void *data, void *data_end, __u32 frame_len, struct pkt_desc *p, void **l4)
{
	struct ethhdr *eth = data;
	__u32 frame = frame_len > sizeof(*eth) ? frame_len - sizeof(*eth) : 0;

	if ((void *)(eth + 1) > data_end)
		return PARSE_MALFORMED;
	if (eth->h_proto == ETH_P_IP_BE) {
		struct iphdr *iph = (void *)(eth + 1);

		__u32 tot_len, hdr_len;

		if ((void *)(iph + 1) > data_end)
			return PARSE_MALFORMED;
		hdr_len = iph->ihl * 4;
		tot_len = bpf_ntohs(iph->tot_len);
		/* A bad version, a header longer than the frame or than the packet, a total
		 * length beyond the frame (a shorter one is Ethernet padding). */
		if (iph->version != 4 || iph->ihl < 5 || hdr_len > frame || tot_len < hdr_len || tot_len > frame)
			return PARSE_MALFORMED;
		if (iph->ihl != 5)
			return PARSE_OPTIONS;
		if (iph->frag_off & bpf_htons(IP_MF_ | IP_OFFSET_))
			return PARSE_FRAGMENT;
		p->flow.family = FAM_V4;
		p->flow.proto = iph->protocol;
		p->flow.src[0] = iph->saddr;
		p->flow.dst[0] = iph->daddr;
		p->l3_len = tot_len;
		p->tos = iph->tos;
		*l4 = iph + 1;
		return PARSE_OK;
	}
	if (eth->h_proto == ETH_P_IPV6_BE) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		__u32 l3_len;

		if ((void *)(ip6 + 1) > data_end)
			return PARSE_MALFORMED;
		l3_len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
		if (ip6->version != 6 || l3_len > frame)
			return PARSE_MALFORMED;
		if (ip6->nexthdr == IPV6_FRAG_HDR_)
			return PARSE_FRAGMENT;
		p->flow.family = FAM_V6;
		p->flow.proto = ip6->nexthdr;
		__builtin_memcpy(p->flow.src, &ip6->saddr, 16);
		__builtin_memcpy(p->flow.dst, &ip6->daddr, 16);
		p->l3_len = l3_len;
		p->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
		*l4 = ip6 + 1;
		return PARSE_OK;
	}
	return PARSE_NOT_IP;
}

static __always_inline int parse_packet(void *data, void *data_end, __u32 frame_len, struct pkt_desc *p)
{
	void *l4 = 0;
	int r = parse_ip(data, data_end, frame_len, p, &l4);

	return r == PARSE_OK ? parse_l4(l4, data_end, p) : r;
}

#endif /* LB_PARSE_H */
