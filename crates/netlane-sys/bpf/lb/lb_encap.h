/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Encapsulation towards a real: IPIP (IPv4 in IPv4) or IPv6 outer (IPv6 in IPv6, and
 * IPv4 in IPv6). The outer source varies with the flow hash so the reals' RSS spreads
 * flows across their queues; TTL/hop limit 64, inner TOS copied. */
#ifndef LB_ENCAP_H
#define LB_ENCAP_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#include "lb_consts.h"
#include "lb_structs.h"

static __always_inline __u16 ipv4_csum(struct iphdr *iph)
{
	__u32 sum = 0;
	__u16 *w = (__u16 *)iph;

#pragma unroll
	for (int i = 0; i < (int)sizeof(*iph) / 2; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

static __always_inline void put_eth(struct ethhdr *eth, const struct lb_config *cfg, __u16 proto_be)
{
	__builtin_memcpy(eth->h_dest, cfg->gw_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->own_mac, ETH_ALEN);
	eth->h_proto = proto_be;
}

/* Prepends an outer IPv4 header (the packet's Ethernet header is rewritten). */
static __always_inline int encap_ipip(struct xdp_md *ctx, const struct pkt_desc *p, const struct real_def *real,
				      const struct lb_config *cfg, __u32 hash)
{
	if (bpf_xdp_adjust_head(ctx, 0 - (int)sizeof(struct iphdr)))
		return -1;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = (void *)(eth + 1);

	if ((void *)(iph + 1) > data_end)
		return -1;
	put_eth(eth, cfg, ETH_P_IP_BE);
	iph->version = 4;
	iph->ihl = 5;
	iph->tos = p->tos;
	iph->tot_len = bpf_htons(p->l3_len + sizeof(*iph));
	iph->id = 0;
	iph->frag_off = 0;
	iph->ttl = OUTER_TTL;
	iph->protocol = IPPROTO_IPIP_;
	iph->check = 0;
	iph->saddr = cfg->src4 ^ bpf_htonl(hash & 0xffff);
	iph->daddr = real->addr[0];
	iph->check = ipv4_csum(iph);
	return 0;
}

/* Prepends an outer IPv6 header; the inner packet is IPv6 or IPv4. */
static __always_inline int encap_ip6(struct xdp_md *ctx, const struct pkt_desc *p, const struct real_def *real,
				     const struct lb_config *cfg, __u32 hash)
{
	if (bpf_xdp_adjust_head(ctx, 0 - (int)sizeof(struct ipv6hdr)))
		return -1;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);

	if ((void *)(ip6 + 1) > data_end)
		return -1;
	put_eth(eth, cfg, ETH_P_IPV6_BE);
	ip6->version = 6;
	ip6->priority = p->tos >> 4;
	ip6->flow_lbl[0] = ((p->tos & 0xf) << 4) | ((hash >> 16) & 0xf);
	ip6->flow_lbl[1] = hash >> 8;
	ip6->flow_lbl[2] = hash;
	ip6->payload_len = bpf_htons(p->l3_len);
	ip6->nexthdr = p->flow.family == FAM_V4 ? IPPROTO_IPIP_ : IPPROTO_IPV6_;
	ip6->hop_limit = OUTER_TTL;
	__builtin_memcpy(&ip6->saddr, cfg->src6, 16);
	ip6->saddr.in6_u.u6_addr32[3] ^= bpf_htonl(hash);
	__builtin_memcpy(&ip6->daddr, real->addr, 16);
	return 0;
}

#endif /* LB_ENCAP_H */
