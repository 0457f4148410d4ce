/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Common includes and helpers for netlane's BPF programs. */
#ifndef NL_COMMON_H
#define NL_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#endif /* NL_COMMON_H */
