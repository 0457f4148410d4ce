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
#define IP_MF_ 0x2000
#define IP_OFFSET_ 0x1FFF
#define IPV6_FRAG_HDR_ 44
#define TCP_SYN_ 0x02
#define OUTER_TTL 64

/* Families in keys and reals. */
#define FAM_V4 4
#define FAM_V6 6

/* Global counters (index into global_stats). */
enum lb_global_stat {
	ST_PASS_NON_IP = 0, /* not IPv4/IPv6: to the stack */
	ST_PASS_NON_VIP,    /* IP but no VIP: to the stack */
	ST_DROP_MALFORMED,  /* truncated or inconsistent headers */
	ST_DROP_IP_OPTIONS, /* IPv4 with options */
	ST_DROP_FRAGMENT,   /* IPv4 or IPv6 fragments */
	ST_DROP_NO_REAL,    /* VIP whose ring slot has no real */
	ST_DROP_ENCAP,      /* no headroom for the outer header */
	ST_TX,              /* encapsulated and sent */
	ST_CONN_HIT,        /* connection-table hit */
	ST_CONN_MISS,       /* connection-table miss: ring lookup */
	ST_ICMP_ECHO,       /* echo requests to a VIP answered */
	ST_NUM
};

#endif /* LB_CONSTS_H */
