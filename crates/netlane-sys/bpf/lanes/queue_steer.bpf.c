// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Ingress steering of an application's traffic into its queue group: the NIC's
 * classifier (flower with hw_tc, or a flow director rule) emulated on the wire side of
 * a veth, as flow_tagger.bpf.c emulates the NIC's flow tags.
 *
 * A veth packet arrives on the peer's receive queue with the number of the transmit
 * queue it left by. This TCX egress program, on the end that faces the server, matches
 * a packet's destination (address, port, protocol) against the rules and picks a queue
 * of the rule's group by the flow's hash; it records it as skb->queue_mapping = queue
 * + 1, which the transmit queue selection takes as a recorded receive queue
 * (skb_tx_hash) when the device has no XPS map and the socket has no queue cached yet
 * (the first packet of a flow; the socket then keeps the queue for the flow's life).
 * Other packets leave untouched.
 */
#include "nl_common.h"

#define TCX_NEXT -1

#ifndef MAX_STEER_RULES
#define MAX_STEER_RULES 1024
#endif

/* A destination: IPv4 in addr[0], IPv6 in all four words, network byte order; port in
 * network byte order. */
struct steer_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto;
	__u8 family;
};

/* A queue group: queues first .. first + count - 1. */
struct steer_group {
	__u32 first;
	__u32 count;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_STEER_RULES);
	__type(key, struct steer_key);
	__type(value, struct steer_group);
} steer_rules SEC(".maps");

#define STAT_STEERED 0
#define STAT_OTHER 1

/* Packets given a queue, and packets left alone. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} steer_stats SEC(".maps");

static __always_inline int count(__u32 which)
{
	nl_count(&steer_stats, which);
	return TCX_NEXT;
}

/* The destination of a TCP or UDP packet, or -1. */
static __always_inline int destination(struct __sk_buff *skb, struct steer_key *k)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u8 *l4;

	if ((void *)(eth + 1) > data_end)
		return -1;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		__u8 *ip = (void *)(eth + 1);
		__u32 ihl;

		if ((void *)(ip + 20) > data_end)
			return -1;
		ihl = (ip[0] & 0x0f) * 4;
		/* Fragments after the first have no ports. */
		if (ihl < 20 || (bpf_ntohs(*(__u16 *)(ip + 6)) & 0x1fff))
			return -1;
		k->family = 4;
		k->proto = ip[9];
		k->addr[0] = *(__u32 *)(ip + 16);
		l4 = ip + ihl;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		__u8 *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 40) > data_end)
			return -1;
		k->family = 6;
		/* No extension headers: a rule's traffic is plain TCP or UDP. */
		k->proto = ip6[6];
		__builtin_memcpy(k->addr, ip6 + 24, 16);
		l4 = ip6 + 40;
	} else {
		return -1;
	}
	if (k->proto != 6 /* TCP */ && k->proto != 17 /* UDP */)
		return -1;
	if ((void *)(l4 + 4) > data_end)
		return -1;
	k->port = *(__u16 *)(l4 + 2);
	return 0;
}

SEC("tc")
int queue_steer(struct __sk_buff *skb)
{
	struct steer_key k = {};
	struct steer_group *g;
	__u32 queue;

	if (destination(skb, &k) < 0)
		return count(STAT_OTHER);
	g = bpf_map_lookup_elem(&steer_rules, &k);
	if (!g || !g->count)
		return count(STAT_OTHER);
	queue = g->first + bpf_get_hash_recalc(skb) % g->count;
	skb->queue_mapping = queue + 1;
	return count(STAT_STEERED);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
