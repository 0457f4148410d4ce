/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Where a packet's hint comes from, and the flow-entry checks that make hints safe.
 *
 * Two sources, one per build of balancer.bpf.c:
 * - device-bound (LB_DEV_BOUND): the RX hash from the bpf_xdp_metadata_rx_hash kfunc,
 *   i.e. what the NIC (on veth: the skb hash, which a tc program on the sending side can
 *   set) hands to XDP. Device-bound programs cannot be test-run.
 * - otherwise: a 32-bit hint in the first 4 bytes of the XDP metadata area (data_meta),
 *   as a NIC or an earlier program writes it. BPF_PROG_RUN fills data_meta from the
 *   test input, so the fixtures and the lab's generator use this build.
 * Either way the value is only a hint: every entry it selects is checked against the
 * packet (5-tuple) and the real's generation before use. */
#ifndef LB_HINT_H
#define LB_HINT_H

#include "lb_structs.h"

#ifdef LB_DEV_BOUND
/* The kernel's enum (include/net/xdp.h); only its kind and size matter for the
 * kfunc's BTF check. */
enum xdp_rss_hash_type {
	XDP_RSS_TYPE_NONE = 0,
};
extern int bpf_xdp_metadata_rx_hash(const struct xdp_md *ctx, __u32 *hash, enum xdp_rss_hash_type *rss_type) __ksym;

static __always_inline int read_hint(struct xdp_md *ctx, __u32 *hint)
{
	enum xdp_rss_hash_type type;

	return bpf_xdp_metadata_rx_hash(ctx, hint, &type) == 0;
}
#else
static __always_inline int read_hint(struct xdp_md *ctx, __u32 *hint)
{
	__u32 *h = (void *)(long)ctx->data_meta;
	void *data = (void *)(long)ctx->data;

	if ((void *)(h + 1) > data)
		return 0;
	*hint = *h;
	return 1;
}
#endif

/* The tag key (set by the loader from a random source before load). */
const volatile __u32 tag_key = 0;

/* The check bits of a tag of `kind` for `value`: murmur3's 32-bit finaliser over the
 * value, the kind and the key (the Rust side computes the same in layout.rs). */
static __always_inline __u32 tag_check(__u32 value, __u32 kind)
{
	__u32 h = (value | (kind << TAG_VALUE_BITS)) ^ tag_key;

	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h >> TAG_VALUE_BITS;
}

/* Whether `hint` is a tag of `kind`; its value in *value. */
static __always_inline int tag_value(__u32 hint, __u32 kind, __u32 *value)
{
	*value = hint & TAG_VALUE_MASK;
	return (hint >> TAG_VALUE_BITS) == tag_check(*value, kind);
}

static __always_inline int flow_eq(const struct flow_key *a, const struct flow_key *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	__u32 d = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*a) / 4); i++)
		d |= x[i] ^ y[i];
	return d == 0;
}

#endif /* LB_HINT_H */
