/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow hashing: Bob Jenkins' lookup3 final mix over three words (the kernel's
 * jhash_3words), so the same flow always lands on the same ring slot. */
#ifndef LB_HASH_H
#define LB_HASH_H

#include <linux/types.h>

#define LB_HASH_SEED 0x6c616e65u

static __always_inline __u32 rol32(__u32 w, unsigned int s)
{
	return (w << s) | (w >> (32 - s));
}

static __always_inline __u32 jhash_final3(__u32 a, __u32 b, __u32 c)
{
	c ^= b;
	c -= rol32(b, 14);
	a ^= c;
	a -= rol32(c, 11);
	b ^= a;
	b -= rol32(a, 25);
	c ^= b;
	c -= rol32(b, 16);
	a ^= c;
	a -= rol32(c, 4);
	b ^= a;
	b -= rol32(a, 14);
	c ^= b;
	c -= rol32(b, 24);
	return c;
}

static __always_inline __u32 jhash3(__u32 a, __u32 b, __u32 c)
{
	__u32 init = 0xdeadbeef + (3 << 2) + LB_HASH_SEED;

	return jhash_final3(a + init, b + init, c + init);
}

/* Hash of a flow's source address, ports and protocol (the destination is the VIP). */
static __always_inline __u32 flow_hash(const struct flow_key *f)
{
	__u32 src = f->src[0] ^ f->src[1] ^ f->src[2] ^ f->src[3];
	__u32 ports = ((__u32)f->sport << 16) | f->dport;

	return jhash3(src, ports, f->proto);
}

#endif /* LB_HASH_H */
