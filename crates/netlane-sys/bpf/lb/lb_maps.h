/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The load balancer's maps. Sizes are defaults; the loader resizes them from the
 * configuration before loading. */
#ifndef LB_MAPS_H
#define LB_MAPS_H

#include "lb_consts.h"
#include "lb_structs.h"

/* VIP -> its ring's position. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIPS);
	__type(key, struct vip_key);
	__type(value, struct vip_meta);
} vip_map SEC(".maps");

/* VIP index -> its key (family 0: no VIP), so that a destination tag's real can be
 * checked against the packet's VIP with an array read instead of a hash lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_key);
} vip_keys SEC(".maps");

/* Addresses that have at least one VIP (answered to ICMP echo). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIPS);
	__type(key, struct vip_addr);
	__type(value, __u32);
} vip_addrs SEC(".maps");

/* All VIPs' Maglev rings back to back: slot -> real index + 1 (0: empty, as the map
 * starts, so no ring needs writing before its VIP exists). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_VIPS * 65537);
	__type(key, __u32);
	__type(value, __u32);
} ring_map SEC(".maps");

/* Real index -> address. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_REALS);
	__type(key, __u32);
	__type(value, struct real_def);
} reals SEC(".maps");

/* Flow -> real; one LRU list per CPU (BPF_F_NO_COMMON_LRU). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CONN_ENTRIES);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct flow_key);
	__type(value, struct conn_val);
} conn_table SEC(".maps");

/* Sending addresses (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
} lb_cfg SEC(".maps");

/* Counters. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ST_NUM);
	__type(key, __u32);
	__type(value, __u64);
} global_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct lb_counter);
} vip_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_REALS);
	__type(key, __u32);
	__type(value, struct lb_counter);
} real_stats SEC(".maps");

/* Per-CPU new-connection rate window (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rate_window);
} conn_rate SEC(".maps");

/* Per-CPU new-flow event rate window (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rate_window);
} event_rate SEC(".maps");

/* rx-hash hint: one flow cache per CPU, indexed by hash & (HINT_CACHE - 1), laid out
 * CPU after CPU in one array (one lookup, contiguous memory; a PERCPU_ARRAY would add
 * a pointer load, usually a cache miss, per packet). The loader sizes it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HINT_CACHE);
	__type(key, __u32);
	__type(value, struct flow_entry);
} hint_cache SEC(".maps");

/* Per-flow tags: tag id -> the flow it was given to and its real (control plane). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FLOW_TAGS);
	__type(key, __u32);
	__type(value, struct flow_entry);
} flow_tags SEC(".maps");

/* New-flow events for the control plane (tag modes). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EVENT_RING_BYTES);
} flow_events SEC(".maps");

#endif /* LB_MAPS_H */
