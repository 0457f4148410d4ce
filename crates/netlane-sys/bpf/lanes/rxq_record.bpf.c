// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * A NIC driver records the receive queue a packet came on (skb_record_rx_queue: the
 * skb's queue_mapping becomes queue + 1), and TCP keeps it on the socket, where XPS by
 * receive queue (xps_rxqs) reads it to pick the transmit queue paired with it. A veth
 * records nothing: a packet arrives with the number of the transmit queue it left the
 * peer by, which is also the receive queue it came on, so queue 0 reads as "none" and
 * queue i as queue i - 1, and xps_rxqs sends every reply on the wrong queue.
 *
 * This TCX ingress program, on the end whose sockets reply, records the queue as a
 * driver would. Packets whose mapping is out of the device's queues pass untouched.
 */
#include "nl_common.h"

#define TCX_NEXT -1

/* The device's receive queues; set at load. */
const volatile __u32 rx_queues = 0;

#define STAT_RECORDED 0
#define STAT_OTHER 1

/* Packets recorded, and packets left alone. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} rxq_stats SEC(".maps");

SEC("tc")
int rxq_record(struct __sk_buff *skb)
{
	__u32 q = skb->queue_mapping;

	if (q >= rx_queues) {
		nl_count(&rxq_stats, STAT_OTHER);
		return TCX_NEXT;
	}
	skb->queue_mapping = q + 1;
	nl_count(&rxq_stats, STAT_RECORDED);
	return TCX_NEXT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
