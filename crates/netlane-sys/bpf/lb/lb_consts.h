/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Load balancer constants and compile-time tunables (maps are resized at load time
 * from the configuration; these are the defaults and upper bounds). */
#ifndef LB_CONSTS_H
#define LB_CONSTS_H

#ifndef MAX_VIPS
#define MAX_VIPS 512
#endif
#ifndef MAX_REALS
#define MAX_REALS 4096
#endif
#ifndef CONN_ENTRIES
#define CONN_ENTRIES 65536
#endif
#ifndef FLOW_TAGS
#define FLOW_TAGS 65536 /* per-flow tag table (tag ids 0..FLOW_TAGS) */
#endif
#ifndef HINT_CACHE
#define HINT_CACHE 65536 /* per-CPU rx-hash flow cache (a power of two) */
#endif
#ifndef EVENT_RING_BYTES
#define EVENT_RING_BYTES (256 * 1024) /* new-flow events (a power-of-two number of pages) */
#endif

#define ETH_P_IP_BE bpf_htons(0x0800)
#define ETH_P_IPV6_BE bpf_htons(0x86DD)
#define IPPROTO_IPIP_ 4
#define IPPROTO_IPV6_ 41
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define IPPROTO_ICMP_ 1
#define IPPROTO_ICMPV6_ 58
#define ICMP_ECHO_ 8
#define ICMP_ECHOREPLY_ 0
#define ICMPV6_ECHO_ 128
#define ICMPV6_ECHOREPLY_ 129
#define ICMP_DEST_UNREACH_ 3
#define ICMP_FRAG_NEEDED_ 4
#define ICMPV6_PKT_TOOBIG_ 2
#define IP_MF_ 0x2000
#define IP_OFFSET_ 0x1FFF
#define IPV6_FRAG_HDR_ 44
#define TCP_SYN_ 0x02
#define OUTER_TTL 64

#define NSEC_PER_SEC 1000000000ull

/* New-flow events a CPU sends per second at most (the control plane's budget). A flow
 * whose event is refused, by this or by a full ring, is announced by a later packet. */
#ifndef MAX_EVENTS_PER_CPU_PER_SEC
#define MAX_EVENTS_PER_CPU_PER_SEC 262144
#endif

/* Connection flags (conn_val.flags). */
#define CONN_UNANNOUNCED 1u /* recorded while its new-flow event could not be sent */

/* VIP flags (vip_meta.flags). */
#define VIP_NO_LRU 1u /* pure consistent hashing: no connection-table state */

/* Hint sources (the loader's hint_mode). The Rust side's constants for the codes, tag
 * kinds and families are generated from these lines by the build script. */
#define HINT_OFF 0	/* legacy NIC: no metadata used */
#define HINT_RX_HASH 1	/* RX hash indexes a per-CPU flow cache */
#define HINT_FLOW_TAG 2 /* classifier tags flows with a per-flow tag id */
#define HINT_DEST_TAG 3 /* classifier tags flows with their real's index */

/* A tag is a 32-bit hint: the low TAG_VALUE_BITS name a per-flow tag id or a real's
 * index, the top bits are a check keyed by a secret the loader picks at random (see
 * tag_check in lb_hint.h). A NIC's RSS hash has the same width; without the key a hash
 * passes the check with probability 2^-(32 - TAG_VALUE_BITS), and nobody can choose
 * tuples whose hash passes, so hashes are read as "untagged", not as tags. */
#define TAG_VALUE_BITS 20
#define TAG_VALUE_MASK ((1u << TAG_VALUE_BITS) - 1)
#define TAG_VALUES 0x100000 /* Tag ids and real indexes a tag can name (2^TAG_VALUE_BITS). */
#define TAG_KIND_FLOW 1u    /* Mixed into a per-flow tag's check (the value is a tag id). */
#define TAG_KIND_DEST 2u    /* Mixed into a per-destination tag's check (the value is a real's index). */

/* Families in keys and reals. */
#define FAM_V4 4 /* IPv4 in keys and reals. */
#define FAM_V6 6 /* IPv6 in keys and reals. */

/* Global counters (index into global_stats). The Rust side's GlobalStat is generated
 * from this enum by the build script: one entry per line, `ST_<NAME>`, its doc comment
 * on the same line; the counter's reported name is <name> in lower case. */
enum lb_global_stat {
	ST_PASS_NON_IP = 0,   /* Not IPv4/IPv6: to the stack. */
	ST_PASS_NON_VIP,      /* IP but no VIP: to the stack. */
	ST_DROP_MALFORMED,    /* Truncated or inconsistent headers: dropped. */
	ST_DROP_IP_OPTIONS,   /* IPv4 with options: dropped. */
	ST_DROP_FRAGMENT,     /* IPv4 or IPv6 fragments: dropped. */
	ST_DROP_NO_REAL,      /* A VIP whose ring slot has no real: dropped. */
	ST_DROP_ENCAP,	      /* No headroom for the outer header: dropped. */
	ST_TX,		      /* Encapsulated and sent. */
	ST_CONN_HIT,	      /* Connection-table hits. */
	ST_CONN_MISS,	      /* Connection-table misses (ring lookups). */
	ST_ICMP_ECHO,	      /* Echo requests to a VIP answered. */
	ST_ICMP_TOO_BIG,      /* Frag-needed / packet-too-big errors routed to the flow's real. */
	ST_CONN_STALE,	      /* Connection entries for removed reals or idle UDP flows. */
	ST_CONN_RATE_LIMITED, /* New flows not recorded: above the per-CPU rate guard. */
	ST_HINT_HIT,	      /* Hints (cache entry or tag) used: lookups skipped. */
	ST_HINT_MISS,	      /* Hints without a usable entry: full path. */
	ST_HINT_STALE,	      /* Hints whose entry or tag was stale (real gone, wrong VIP, other flow). */
	ST_EVENTS,	      /* New-flow events sent to the control plane. */
	ST_EVENTS_LOST,	      /* New-flow events lost (ring buffer full). */
	ST_DROP_UNSUPPORTED, /* To a VIP address but not a protocol it handles (IPv6 extension headers, others): dropped. */
	ST_EVENTS_LIMITED, /* New-flow events not sent: above the per-CPU event rate. */
	ST_HINT_DIRECT, /* Hints used by destination tags that skipped the transport header (user space counts them as hint hits too). */
	ST_NUM
};

#endif /* LB_CONSTS_H */
