// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The device-bound build of the balancer: the same program, with the hint read from
 * the NIC through the bpf_xdp_metadata_rx_hash kfunc (see lb_hint.h). It must be loaded
 * bound to its interface (prog_ifindex + BPF_F_XDP_DEV_BOUND_ONLY) and attached in
 * native mode, and cannot be test-run; fixtures use balancer.bpf.c.
 */
#define LB_DEV_BOUND 1
#include "balancer.bpf.c"
