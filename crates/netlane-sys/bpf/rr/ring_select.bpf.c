// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The adaptive TPACKET_V3 path's fanout program.
 *
 * The path keeps packet rings of several block sizes in one PACKET_FANOUT_EBPF group;
 * the kernel runs this program once per frame and hands the frame to the member whose
 * index (in joining order) it returns. User space moves the traffic to another ring by
 * writing `active_ring` through the skeleton's memory-mapped .bss: no system call, and
 * no other member sees the frame (a drop-everything filter on the idle rings would
 * still cost one delivery per ring and frame).
 */
#include "nl_common.h"

/* Index of the ring that takes the traffic; written by user space. */
volatile __u32 active_ring = 0;

SEC("socket")
int ring_select(struct __sk_buff *skb)
{
	return active_ring;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
