// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * netlane's XDP L4 load balancer (Katran-class, direct server return).
 *
 * Ethernet -> IPv4/IPv6 -> TCP/UDP -> VIP lookup {addr, port, proto}, retried with
 * port 0 -> connection table (per-CPU LRU; SYNs skip it) -> else the VIP's Maglev ring
 * -> encapsulate to the real and XDP_TX. ICMP echo requests to a VIP address are
 * answered here. Non-VIP traffic goes to the stack;
 * fragments, IPv4 options and malformed headers are dropped and counted.
 */
#include "nl_common.h"
#include "lb_consts.h"
#include "lb_structs.h"
#include "lb_maps.h"
#include "lb_parse.h"
#include "lb_hash.h"
#include "lb_encap.h"
#include "lb_icmp.h"

/* Ring size per VIP, set by the loader before load (a prime). */
const volatile __u32 ring_size = 65537;

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&global_stats, &which);

	if (v)
		*v += 1;
}

static __always_inline void add_counter(void *map, __u32 index, __u64 bytes)
{
	struct lb_counter *c = bpf_map_lookup_elem(map, &index);

	if (c) {
		c->packets += 1;
		c->bytes += bytes;
	}
}

SEC("xdp")
int balancer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct pkt_desc p = {};
	__u32 zero = 0;

	switch (parse_packet(data, data_end, &p)) {
	case PARSE_OK:
		break;
	case PARSE_NOT_IP:
		count(ST_PASS_NON_IP);
		return XDP_PASS;
	case PARSE_NOT_L4:
		if (p.flow.proto == IPPROTO_ICMP_ || p.flow.proto == IPPROTO_ICMPV6_) {
			struct vip_addr va = {};

			__builtin_memcpy(va.addr, p.flow.dst, sizeof(va.addr));
			va.family = p.flow.family;
			if (bpf_map_lookup_elem(&vip_addrs, &va) &&
			    icmp_echo_reply(data, data_end, p.flow.family) == 0) {
				count(ST_ICMP_ECHO);
				return XDP_TX;
			}
		}
		count(ST_PASS_NON_VIP);
		return XDP_PASS;
	case PARSE_OPTIONS:
		count(ST_DROP_IP_OPTIONS);
		return XDP_DROP;
	case PARSE_FRAGMENT:
		count(ST_DROP_FRAGMENT);
		return XDP_DROP;
	default:
		count(ST_DROP_MALFORMED);
		return XDP_DROP;
	}

	struct vip_key vk = {};
	__builtin_memcpy(vk.addr, p.flow.dst, sizeof(vk.addr));
	vk.port = p.flow.dport;
	vk.proto = p.flow.proto;
	vk.family = p.flow.family;
	struct vip_meta *vip = bpf_map_lookup_elem(&vip_map, &vk);
	if (!vip) {
		vk.port = 0;
		vip = bpf_map_lookup_elem(&vip_map, &vk);
	}
	if (!vip) {
		count(ST_PASS_NON_VIP);
		return XDP_PASS;
	}
	__u32 vip_index = vip->index;
	__u64 bytes = (__u64)((long)data_end - (long)data);
	add_counter(&vip_stats, vip_index, bytes);

	__u32 hash = flow_hash(&p.flow);
	__u32 real_index = 0;
	struct conn_val *cv = 0;
	int is_syn = p.flow.proto == IPPROTO_TCP_ && (p.tcp_flags & TCP_SYN_);

	if (!is_syn)
		cv = bpf_map_lookup_elem(&conn_table, &p.flow);
	if (cv) {
		real_index = cv->real;
		count(ST_CONN_HIT);
	} else {
		__u32 size = ring_size;
		__u32 slot;
		__u32 *r;

		if (size == 0)
			size = 1;
		slot = vip_index * size + hash % size;
		r = bpf_map_lookup_elem(&ring_map, &slot);
		if (!r || *r == 0xffffffff) {
			count(ST_DROP_NO_REAL);
			return XDP_DROP;
		}
		real_index = *r;
		struct conn_val nv = { .real = real_index };
		bpf_map_update_elem(&conn_table, &p.flow, &nv, BPF_ANY);
		count(ST_CONN_MISS);
	}

	struct real_def *real = bpf_map_lookup_elem(&reals, &real_index);
	struct lb_config *cfg = bpf_map_lookup_elem(&lb_cfg, &zero);
	if (!real || !cfg || real->family == 0) {
		count(ST_DROP_NO_REAL);
		return XDP_DROP;
	}
	int err;
	if (real->family == FAM_V4)
		err = encap_ipip(ctx, &p, real, cfg, hash);
	else
		err = encap_ip6(ctx, &p, real, cfg, hash);
	if (err) {
		count(ST_DROP_ENCAP);
		return XDP_DROP;
	}
	add_counter(&real_stats, real_index, bytes);
	count(ST_TX);
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
