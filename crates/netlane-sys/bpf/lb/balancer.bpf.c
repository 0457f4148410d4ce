// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * netlane's XDP L4 load balancer (Katran-class, direct server return).
 *
 * Ethernet -> IPv4/IPv6 -> TCP/UDP -> [hint fast path] -> VIP lookup {addr, port,
 * proto}, retried with port 0 -> connection table (per-CPU LRU; SYNs and "no LRU" VIPs
 * skip it; entries of removed reals and idle UDP flows are stale) -> else the VIP's
 * Maglev ring -> encapsulate to the real and XDP_TX.
 *
 * Hints (hint_mode, see lb_hint.h for the sources): a per-CPU flow cache indexed by
 * the RX hash, or classifier tags naming a per-flow entry or the real itself. A hint
 * only skips lookups after its entry matched the packet and its real is still one of
 * the VIP's; anything else takes the full path, so untagged traffic always works.
 * With tag_direct, a destination tag skips the transport header too (see
 * dest_tag_direct()).
 *
 * ICMP echo requests to a VIP address are answered here; frag-needed/too-big errors
 * go to the flow's real. Non-VIP traffic goes to the stack; fragments, IPv4 options and
 * malformed headers are dropped and counted.
 */
#include "nl_common.h"
#include "lb_consts.h"
#include "lb_structs.h"
#include "lb_maps.h"
#include "lb_parse.h"
#include "lb_hash.h"
#include "lb_encap.h"
#include "lb_icmp.h"
#include "lb_hint.h"

/* Set by the loader before load. */
const volatile __u32 ring_size = 65537; /* ring slots per VIP (a prime) */
const volatile __u32 hint_mode = HINT_OFF;
const volatile __u32 hint_cache_mask = HINT_CACHE - 1;
const volatile __u32 flow_tag_count = FLOW_TAGS;
const volatile __u32 hint_cache_cpus = 1; /* CPUs with a flow cache in hint_cache */
const volatile __u32 tag_direct = 0;	  /* destination tags take dest_tag_direct() */

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&global_stats, &which);

	if (v)
		*v += 1;
}

static __always_inline void add_counter(void *map, __u32 index, __u64 bytes)
{
	struct lb_counter *c = bpf_map_lookup_elem(map, &index);

	if (c) {
		c->packets += 1;
		c->bytes += bytes;
	}
}

/* The per-CPU rate guard: may this CPU record one more new connection now? */
/* Whether one more event fits in this CPU's one-second window of `map` (a per-CPU
 * array holding one struct rate_window) with at most `limit` per window. */
static __always_inline int within_rate(void *map, __u64 limit)
{
	__u32 zero = 0;
	struct rate_window *w = bpf_map_lookup_elem(map, &zero);
	__u64 now;

	if (!w)
		return 1;
	now = bpf_ktime_get_ns();
	if (now - w->start > NSEC_PER_SEC) {
		w->start = now;
		w->count = 0;
	}
	return ++w->count <= limit;
}

static __always_inline int new_conn_allowed(const struct lb_config *cfg)
{
	return !cfg->max_new_conns || within_rate(&conn_rate, cfg->max_new_conns);
}

/* The real behind index `index` if it is live and (gen_check) still generation `generation`. */
static __always_inline struct real_def *live_real(__u32 index, __u32 generation, int gen_check)
{
	struct real_def *r = bpf_map_lookup_elem(&reals, &index);

	if (!r || r->family == 0 || (gen_check && r->generation != generation))
		return 0;
	return r;
}

static __always_inline struct vip_meta *find_vip(const struct flow_key *f)
{
	struct vip_key vk = {};
	struct vip_meta *vip;

	__builtin_memcpy(vk.addr, f->dst, sizeof(vk.addr));
	vk.port = f->dport;
	vk.proto = f->proto;
	vk.family = f->family;
	vip = bpf_map_lookup_elem(&vip_map, &vk);
	if (!vip) {
		vk.port = 0;
		vip = bpf_map_lookup_elem(&vip_map, &vk);
	}
	return vip;
}

/* This CPU's rx-hash flow-cache slot for `hint`. */
static __always_inline struct flow_entry *hint_cache_slot(__u32 hint)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 slot;

	if (cpu >= hint_cache_cpus)
		return 0;
	slot = cpu * (hint_cache_mask + 1) + (hint & hint_cache_mask);
	return bpf_map_lookup_elem(&hint_cache, &slot);
}

/* The flow entry a hint names, if it is this packet's flow: a slot of the rx-hash
 * cache or the per-flow tag `id` (when the hint is a valid flow tag). */
static __always_inline struct flow_entry *hinted_entry(__u32 hint, int tagged, __u32 id, const struct flow_key *f)
{
	struct flow_entry *e = 0;

	if (hint_mode == HINT_RX_HASH) {
		e = hint_cache_slot(hint);
	} else if (hint_mode == HINT_FLOW_TAG && tagged && id < flow_tag_count) {
		e = bpf_map_lookup_elem(&flow_tags, &id);
	}
	if (e && flow_eq(&e->flow, f))
		return e;
	return 0;
}

/* Announces a new flow to the control plane; 1 if the event was sent. */
static __always_inline int emit_new_flow(const struct flow_key *f, __u32 real, __u32 generation, __u32 hash, __u32 vip)
{
	struct flow_event ev = { .flow = *f, .real = real, .generation = generation, .hash = hash, .vip = vip };

	if (!within_rate(&event_rate, MAX_EVENTS_PER_CPU_PER_SEC)) {
		count(ST_EVENTS_LIMITED);
		return 0;
	}
	if (bpf_ringbuf_output(&flow_events, &ev, sizeof(ev), 0) == 0) {
		count(ST_EVENTS);
		return 1;
	}
	count(ST_EVENTS_LOST);
	return 0;
}

static __always_inline void count_tx(__u32 vip_index, __u32 real_index, __u64 bytes)
{
	add_counter(&vip_stats, vip_index, bytes);
	add_counter(&real_stats, real_index, bytes);
	count(ST_TX);
}

/* The talk's "marked packets skip parsing": a keyed destination tag goes from an L3
 * check straight to encapsulation. Checked: the IP header (as the full path checks it;
 * no options, no fragments), TCP or UDP, the tag's real live and its VIP on the
 * packet's destination address and protocol. The transport header is not parsed: its
 * first four bytes (the ports, where TCP and UDP both have them) are read for the
 * outer header's hash only, so a flow's outer header is the same before its tag, with
 * it and after (its real's RSS keeps it on one queue, in order). Not checked, which is
 * why it is a variant and not the default: the VIP's port (a classifier that tags by
 * destination address alone would send another port's traffic, even another VIP's on
 * the same address, to the tagged real), and the rest of the transport header (one
 * shorter than TCP's or UDP's is forwarded for the real's stack to drop). XDP_TX after
 * encapsulating, XDP_DROP if that failed, -1 for the full path. */
static __always_inline int dest_tag_direct(struct xdp_md *ctx, __u32 hint, __u64 bytes)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct pkt_desc p = {};
	void *l4 = 0;
	__u32 value = 0, zero = 0;

	if (!tag_value(hint, TAG_KIND_DEST, &value) || parse_ip(data, data_end, bytes, &p, &l4) != PARSE_OK ||
	    (p.flow.proto != IPPROTO_TCP_ && p.flow.proto != IPPROTO_UDP_))
		return -1;
	struct real_def *real = live_real(value, 0, 0);
	if (!real)
		return -1;
	__u32 vip_index = real->vip;
	struct vip_key *k = bpf_map_lookup_elem(&vip_keys, &vip_index);
	struct lb_config *cfg = bpf_map_lookup_elem(&lb_cfg, &zero);

	if (!k || !cfg || k->family != p.flow.family || k->proto != p.flow.proto || k->addr[0] != p.flow.dst[0] ||
	    k->addr[1] != p.flow.dst[1] || k->addr[2] != p.flow.dst[2] || k->addr[3] != p.flow.dst[3])
		return -1;
	__u16 *ports = l4;

	if ((void *)(ports + 2) > data_end)
		return -1;
	p.flow.sport = ports[0];
	p.flow.dport = ports[1];
	__u32 hash = flow_hash(&p.flow);
	int err = real->family == FAM_V4 ? encap_ipip(ctx, &p, real, cfg, hash) : encap_ip6(ctx, &p, real, cfg, hash);

	if (err) {
		count(ST_DROP_ENCAP);
		return XDP_DROP;
	}
	/* One counter a packet, as on the checked path: global_stats() adds these to the
	 * hint hits. */
	count(ST_HINT_DIRECT);
	count_tx(vip_index, value, bytes);
	return XDP_TX;
}

SEC("xdp")
int balancer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 bytes = (__u64)((long)data_end - (long)data);
	struct pkt_desc p = {};
	__u32 zero = 0, hint = 0;
	int have_hint = 0, icmp_error = 0;

	if (hint_mode != HINT_OFF)
		have_hint = read_hint(ctx, &hint);
	if (hint_mode == HINT_DEST_TAG && tag_direct && have_hint) {
		int r = dest_tag_direct(ctx, hint, bytes);

		if (r >= 0)
			return r;
	}

	switch (parse_packet(data, data_end, bytes, &p)) {
	case PARSE_OK:
		break;
	case PARSE_NOT_IP:
		count(ST_PASS_NON_IP);
		return XDP_PASS;
	case PARSE_NOT_L4: {
		struct vip_addr va = {};
		int to_vip, r;

		__builtin_memcpy(va.addr, p.flow.dst, sizeof(va.addr));
		va.family = p.flow.family;
		to_vip = bpf_map_lookup_elem(&vip_addrs, &va) != 0;
		if (p.flow.proto == IPPROTO_ICMP_ || p.flow.proto == IPPROTO_ICMPV6_) {
			if (to_vip && icmp_echo_reply(data, data_end, p.flow.family) == 0) {
				count(ST_ICMP_ECHO);
				return XDP_TX;
			}
			r = icmp_too_big_flow(data, data_end, p.flow.family, &p.flow);
			if (r == 0) {
				icmp_error = 1;
				break;
			}
			if (r == ICMP_TRUNCATED && to_vip) {
				count(ST_DROP_MALFORMED);
				return XDP_DROP;
			}
		} else if (to_vip) {
			/* IPv6 extension headers, other protocols: nothing a real could be
			 * chosen for, and nothing the host behind the VIP should get. */
			count(ST_DROP_UNSUPPORTED);
			return XDP_DROP;
		}
		count(ST_PASS_NON_VIP);
		return XDP_PASS;
	}
	case PARSE_OPTIONS:
		count(ST_DROP_IP_OPTIONS);
		return XDP_DROP;
	case PARSE_FRAGMENT:
		count(ST_DROP_FRAGMENT);
		return XDP_DROP;
	default:
		count(ST_DROP_MALFORMED);
		return XDP_DROP;
	}

	struct lb_config *cfg = bpf_map_lookup_elem(&lb_cfg, &zero);
	struct real_def *real = 0;
	struct vip_meta *vip = 0;
	__u32 real_index = 0, hash = 0, vip_index = 0;

	/* Hint fast path: an entry for exactly this flow, or a destination tag. */
	if (have_hint && !icmp_error) {
		/* A tag's value: a per-flow tag id, or the real a destination tag names. */
		__u32 value = 0;
		int tagged = (hint_mode == HINT_FLOW_TAG && tag_value(hint, TAG_KIND_FLOW, &value)) ||
			     (hint_mode == HINT_DEST_TAG && tag_value(hint, TAG_KIND_DEST, &value));
		struct flow_entry *e = hinted_entry(hint, tagged, value, &p.flow);

		if (e) {
			real = live_real(e->real, e->generation, 1);
			if (real) {
				real_index = e->real;
				hash = e->hash;
				vip_index = e->vip;
			}
		} else if (hint_mode == HINT_DEST_TAG && tagged) {
			/* The tag names the real; it must be one of this packet's VIP's. When
			 * the real's VIP has exactly the packet's address, port and protocol,
			 * that VIP is the one a lookup would find (exact ports first): one
			 * array read. A real of a port-0 VIP takes the lookup. */
			real = live_real(value, 0, 0);
			if (real) {
				__u32 rv = real->vip;
				struct vip_key *k = bpf_map_lookup_elem(&vip_keys, &rv);

				if (k && k->family == p.flow.family && k->proto == p.flow.proto &&
				    k->port == p.flow.dport && k->port != 0 && k->addr[0] == p.flow.dst[0] &&
				    k->addr[1] == p.flow.dst[1] && k->addr[2] == p.flow.dst[2] &&
				    k->addr[3] == p.flow.dst[3]) {
					vip_index = rv;
				} else {
					vip = find_vip(&p.flow);
					if (vip && vip->index == rv)
						vip_index = rv;
					else
						real = 0;
				}
			}
			if (real) {
				real_index = value;
				hash = flow_hash(&p.flow);
			}
		}

		if (real) {
			count(ST_HINT_HIT);
		} else if (e || tagged) {
			count(ST_HINT_STALE);
		} else {
			count(ST_HINT_MISS);
		}
	}

	if (!real) {
		if (!vip)
			vip = find_vip(&p.flow);
		if (!vip) {
			count(ST_PASS_NON_VIP);
			return XDP_PASS;
		}
		vip_index = vip->index;
		hash = flow_hash(&p.flow);

		int use_table = !(vip->flags & VIP_NO_LRU);
		int is_syn = p.flow.proto == IPPROTO_TCP_ && (p.tcp_flags & TCP_SYN_) && !icmp_error;
		int is_udp = p.flow.proto == IPPROTO_UDP_;
		struct conn_val *cv = 0;
		__u64 now = 0;

		if (use_table && !is_syn)
			cv = bpf_map_lookup_elem(&conn_table, &p.flow);
		if (cv) {
			real = live_real(cv->real, cv->generation, 1);
			if (real && is_udp && cfg && cfg->udp_timeout_ms) {
				now = bpf_ktime_get_ns();
				if (now - cv->atime > (__u64)cfg->udp_timeout_ms * 1000000)
					real = 0;
				else
					cv->atime = now;
			}
			if (real) {
				real_index = cv->real;
				count(ST_CONN_HIT);
				/* Recorded while events could not be sent: announce it now. */
				if (hint_mode >= HINT_FLOW_TAG && (cv->flags & CONN_UNANNOUNCED) && !icmp_error &&
				    emit_new_flow(&p.flow, real_index, cv->generation, hash, vip_index))
					cv->flags &= ~CONN_UNANNOUNCED;
			} else {
				count(ST_CONN_STALE);
			}
		}
		if (!real) {
			__u32 size = ring_size ? ring_size : 1;
			__u32 slot = vip_index * size + hash % size;
			__u32 *r = bpf_map_lookup_elem(&ring_map, &slot);

			/* A slot holds its real's index + 1; 0 (as the map starts) is empty. */
			if (r && *r)
				real_index = *r - 1;
			real = r && *r ? live_real(real_index, 0, 0) : 0;
			if (!real) {
				count(ST_DROP_NO_REAL);
				return XDP_DROP;
			}
			count(ST_CONN_MISS);
			/* A flow is recorded, and announced to the control plane, once it is past
			 * its first packet: a SYN is forwarded by the ring alone (a SYN flood
			 * neither churns the table nor announces flows that never completed a
			 * handshake). A flow is announced when its entry is created (or replaces
			 * a stale one), and never when the rate guard refused it. When its event
			 * cannot be sent (above the event rate, or the ring full), the entry is
			 * recorded as unannounced and keeps the flow on its real; a later packet
			 * announces it (above). */
			if (use_table && !icmp_error && !is_syn && cfg) {
				if (new_conn_allowed(cfg)) {
					struct conn_val nv = { .real = real_index, .generation = real->generation };

					if (is_udp && cfg->udp_timeout_ms)
						nv.atime = now ? now : bpf_ktime_get_ns();
					if (hint_mode >= HINT_FLOW_TAG &&
					    !emit_new_flow(&p.flow, real_index, real->generation, hash, vip_index))
						nv.flags = CONN_UNANNOUNCED;
					bpf_map_update_elem(&conn_table, &p.flow, &nv, cv ? BPF_ANY : BPF_NOEXIST);
				} else {
					count(ST_CONN_RATE_LIMITED);
				}
			}
		}
		/* Remember the flow in the rx-hash cache slot its hint names. */
		if (hint_mode == HINT_RX_HASH && have_hint && !icmp_error) {
			struct flow_entry *e = hint_cache_slot(hint);

			if (e) {
				e->flow = p.flow;
				e->real = real_index;
				e->generation = real->generation;
				e->hash = hash;
				e->vip = vip_index;
			}
		}
	}

	if (!cfg) {
		count(ST_DROP_NO_REAL);
		return XDP_DROP;
	}
	int err;
	if (real->family == FAM_V4)
		err = encap_ipip(ctx, &p, real, cfg, hash);
	else
		err = encap_ip6(ctx, &p, real, cfg, hash);
	if (err) {
		count(ST_DROP_ENCAP);
		return XDP_DROP;
	}
	if (icmp_error)
		count(ST_ICMP_TOO_BIG);
	count_tx(vip_index, real_index, bytes);
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
