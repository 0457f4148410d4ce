/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Types shared by the load balancer's maps and the control plane (Rust gets them from
 * the object's BTF through the skeleton). */
#ifndef LB_STRUCTS_H
#define LB_STRUCTS_H

#include <linux/types.h>

/* A VIP: address (IPv4 in addr[0]), port in network order (0 = any), protocol. */
struct vip_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto;
	__u8 family;
};

/* A VIP address, for ICMP (any port and protocol). */
struct vip_addr {
	__u32 addr[4];
	__u8 family;
	__u8 pad[3];
};

/* What the data plane knows of a VIP: where its ring starts. */
struct vip_meta {
	__u32 index;
	__u32 flags;
};

/* A real: where to encapsulate to. Real indexes belong to one VIP (`vip`); `generation`
 * changes whenever the index is removed or reassigned, so state that remembers
 * (real, generation) goes stale instead of pointing at the wrong real. family 0 = none. */
struct real_def {
	__u32 addr[4];
	__u8 family;
	__u8 pad[3];
	__u32 vip;
	__u32 generation;
};

/* A flow's 5-tuple (addresses as in vip_key). */
struct flow_key {
	__u32 src[4];
	__u32 dst[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};

/* Connection-table value: the real chosen for the flow, its generation, and (UDP)
 * when the flow was last seen. */
struct conn_val {
	__u32 real;
	__u32 generation;
	__u64 atime;
	__u32 flags; /* CONN_UNANNOUNCED */
	__u32 pad;
};

/* A flow pinned to a real: an rx-hash cache slot or a per-flow tag's entry. The
 * 5-tuple is compared on every use, so a hash collision or a reused tag id is a miss. */
struct flow_entry {
	struct flow_key flow;
	__u32 real;
	__u32 generation;
	__u32 hash; /* flow hash (outer source) */
	__u32 vip;
};

/* New-flow event for the control plane (tag modes). */
struct flow_event {
	struct flow_key flow;
	__u32 real;
	__u32 generation;
	__u32 hash;
	__u32 vip;
};

/* Rust decodes events with the generated flow_entry (flow_event is only a local, so it
 * has no skeleton type): the two must stay the same. */
_Static_assert(sizeof(struct flow_event) == sizeof(struct flow_entry), "flow_event is flow_entry's size");
_Static_assert(__builtin_offsetof(struct flow_event, real) == __builtin_offsetof(struct flow_entry, real), "real");
_Static_assert(__builtin_offsetof(struct flow_event, generation) == __builtin_offsetof(struct flow_entry, generation),
	       "generation");
_Static_assert(__builtin_offsetof(struct flow_event, hash) == __builtin_offsetof(struct flow_entry, hash), "hash");
_Static_assert(__builtin_offsetof(struct flow_event, vip) == __builtin_offsetof(struct flow_entry, vip), "vip");

/* Per-CPU new-connection rate window. */
struct rate_window {
	__u64 start;
	__u64 count;
};

/* Per-VIP and per-real counters. */
struct lb_counter {
	__u64 packets;
	__u64 bytes;
};

/* Addresses the balancer sends from. */
struct lb_config {
	__u8 gw_mac[6];	      /* next hop towards the reals */
	__u8 own_mac[6];      /* this interface */
	__u32 src4;	      /* outer IPv4 source base; low 16 bits vary by flow */
	__u32 src6[4];	      /* outer IPv6 source base; last 32 bits vary by flow */
	__u32 max_new_conns;  /* per CPU per second recorded in the table; 0 = no limit */
	__u32 udp_timeout_ms; /* idle UDP connection entries expire; 0 = never */
};

#endif /* LB_STRUCTS_H */
