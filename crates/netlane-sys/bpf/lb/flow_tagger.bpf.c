// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The NIC classifier, emulated for veth: a tc (TCX egress) program on the interface
 * that sends to the balancer. For flows the control plane has a rule for, it sets the
 * packet's hash to the rule's tag (bpf_set_hash); veth hands that hash to the
 * balancer's XDP program as the RX hash (bpf_xdp_metadata_rx_hash), which is how a NIC
 * flow tag would arrive. Other packets leave untouched.
 */
#include "nl_common.h"
#include "lb_consts.h"
#include "lb_structs.h"
#include "lb_parse.h"

#define TCX_NEXT -1

/* Flow -> tag: the classifier's rules (written by the control plane). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, __u32);
} tag_rules SEC(".maps");

/* [0] packets tagged, [1] packets seen. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} tagger_stats SEC(".maps");

SEC("tc")
int flow_tagger(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 want = skb->len < 128 ? skb->len : 128;
	struct pkt_desc p = {};
	__u32 *tag;

	nl_count(&tagger_stats, 1);
	/* The headers may not be in the linear part (a packet socket's TX ring hands the
	 * frame over as page fragments after the link-layer header): pull them in. */
	if (data + want > data_end) {
		if (bpf_skb_pull_data(skb, want))
			return TCX_NEXT;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	if (parse_packet(data, data_end, skb->len, &p) != PARSE_OK)
		return TCX_NEXT;
	tag = bpf_map_lookup_elem(&tag_rules, &p.flow);
	if (tag) {
		bpf_set_hash(skb, *tag);
		nl_count(&tagger_stats, 0);
	}
	return TCX_NEXT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
