// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The lab's packet generator and sink.
 *
 * `pktgen` runs under BPF_PROG_RUN in live-frames mode (BPF_F_TEST_XDP_LIVE_FRAMES) on a
 * template TCP/IPv4 frame: each run rewrites the frame for the next of `flows` flows
 * (source address and port) and returns XDP_TX, which the test-run machinery turns
 * into a transmit on the generator's veth: the peer sees a stream of real frames. When
 * `with_hints` is set it also writes the flow's hint (rx hash or tag, from `gen_hints`)
 * into the XDP metadata in front of the frame, where a NIC would put it; veth carries
 * metadata across with the frame. Live frames are recycled without being restored (and
 * the balancer rewrites them in place), so every run writes the whole header again
 * from `header` (Ethernet, IPv4, TCP; set by the loader). TCP checksums are not
 * maintained: the frames end in the sink, never in a socket.
 *
 * Flow order: run k of a pass over the flows sends flow (k * stride) % flows, with the
 * stride from `gen_stride` (coprime with `flows`, so a pass still sends every flow
 * once). Stride 1 is in order; a large stride scatters consecutive frames over the
 * flows, so that state allocated in the order flows were first seen (connection
 * entries, tag ids) is not also walked in that order.
 *
 * Two generators at once (one per CPU, as RSS keeps a flow on one queue): `gen_split`
 * gives each CPU its part of the flows. With `parts` > 1 (dividing `flows`), run k on
 * a CPU whose part is p sends position k * parts + p, so each CPU walks its own
 * residue class of positions and no flow is sent from two CPUs.
 *
 * Chained (`gen_next` set): instead of transmitting, each frame goes on to the program
 * in `gen_next` (a tail call), as if it had arrived on a device: the lab times a
 * program per frame this way with no device in the path (the runner drops the
 * program's XDP_TX output on the loopback device, which cannot transmit XDP frames).
 * With `gen_next` empty the tail call falls through to XDP_TX.
 *
 * `sink` drops and counts what comes back (the balancer's XDP_TX output).
 *
 * `pass` passes everything to the stack. veth only delivers XDP_TX/redirected frames
 * to a peer that has an XDP program (it schedules the peer's NAPI only then), so the
 * interface facing a balancer on veth needs one.
 */
#include "nl_common.h"
#include <linux/ip.h>
#include <linux/tcp.h>

/* Flow f: source address src_base + f / PORTS_PER_ADDR, source port
 * PORT_BASE + f % PORTS_PER_ADDR. */
#define PORTS_PER_ADDR 50000
#define PORT_BASE 10000

const volatile __u32 flows = 1;
const volatile __u32 with_hints = 0;
const volatile __u32 src_base = 0; /* host order */
#define HDR_LEN 54
const volatile __u8 header[HDR_LEN] = {}; /* Ethernet + IPv4 + TCP of every frame */

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gen_seq SEC(".maps");

/* [0]: the stride of the flow order (0 or 1: in order). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen_stride SEC(".maps");

struct gen_split {
	__u32 part;
	__u32 parts; /* 0 or 1: every flow */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_split);
} gen_split SEC(".maps");

/* Flow id -> hint written into the metadata (0 = none). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen_hints SEC(".maps");

/* [0]: the program a generated frame goes to instead of the device (empty: XDP_TX). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen_next SEC(".maps");

/* [0] frames sunk. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sink_stats SEC(".maps");

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

SEC("xdp")
int pktgen(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *seq = bpf_map_lookup_elem(&gen_seq, &zero);
	__u32 *stride = bpf_map_lookup_elem(&gen_stride, &zero);
	struct gen_split *split = bpf_map_lookup_elem(&gen_split, &zero);
	__u32 f, n = flows ? flows : 1;
	__u64 pos;

	if (!seq || !stride || !split)
		return XDP_ABORTED;
	pos = *seq;
	if (split->parts > 1)
		pos = pos * split->parts + split->part;
	f = (__u32)(pos % n);
	if (*stride > 1)
		f = (__u32)((__u64)f * *stride % n);
	*seq += 1;

	if (with_hints) {
		__u32 *hint = bpf_map_lookup_elem(&gen_hints, &f);

		if (hint && *hint && bpf_xdp_adjust_meta(ctx, -(int)sizeof(__u32)) == 0) {
			__u32 *meta = (void *)(long)ctx->data_meta;

			if ((void *)(meta + 1) > (void *)(long)ctx->data)
				return XDP_ABORTED;
			*meta = *hint;
		}
	}

	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = (void *)(eth + 1);
	struct tcphdr *th = (void *)(iph + 1);

	if ((void *)(th + 1) > data_end)
		return XDP_ABORTED;
	__u64 *dst = data;
#pragma unroll
	for (int i = 0; i < HDR_LEN / 8; i++)
		dst[i] = ((const volatile __u64 *)header)[i];
	((__u16 *)data)[HDR_LEN / 2 - 3] = ((const volatile __u16 *)header)[HDR_LEN / 2 - 3];
	((__u16 *)data)[HDR_LEN / 2 - 2] = ((const volatile __u16 *)header)[HDR_LEN / 2 - 2];
	((__u16 *)data)[HDR_LEN / 2 - 1] = ((const volatile __u16 *)header)[HDR_LEN / 2 - 1];
	iph->saddr = bpf_htonl(src_base + f / PORTS_PER_ADDR);
	iph->check = 0;
	__u32 sum = 0;
	__u16 *w = (__u16 *)iph;
#pragma unroll
	for (int i = 0; i < (int)sizeof(*iph) / 2; i++)
		sum += w[i];
	iph->check = csum_fold(sum);
	th->source = bpf_htons(PORT_BASE + f % PORTS_PER_ADDR);
	bpf_tail_call(ctx, &gen_next, 0);
	return XDP_TX;
}

SEC("xdp")
int sink(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&sink_stats, &zero);

	if (n)
		*n += 1;
	return XDP_DROP;
}

SEC("xdp")
int pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
