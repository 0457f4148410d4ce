/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Common includes and helpers for netlane's BPF programs. */
#ifndef NL_COMMON_H
#define NL_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Adds one to entry `i` of a per-CPU array of __u64 counters. */
static __always_inline void nl_count(void *map, __u32 i)
{
	__u64 *v = bpf_map_lookup_elem(map, &i);

	if (v)
		*v += 1;
}

#endif /* NL_COMMON_H */
