//! netlane: the shortest, cheapest path between the wire and the application thread
//! on stock Linux, and the measurements that prove it.
//!
//! The core library. Layers, from the bottom:
//!
//! - [`sockopt`], [`time`]: safe wrappers over the kernel interfaces netlane uses (all
//!   `unsafe` lives in the `netlane-sys` crate);
//! - sans-IO cores with no sockets and no clocks: [`udp::gso`] (GSO batch planning),
//!   [`udp::gro`] (splitting coalesced reads), [`zerocopy::Tracker`] (completion
//!   ranges), [`pace`] (the pacing schedule);
//! - the datagram paths: [`udp`] (sockets, the [`udp::Sender`] with latched GSO and
//!   zerocopy fallbacks, the [`udp::Receiver`] with recvmmsg and GRO), [`probe`] (which
//!   kernel features work here, and why not);
//! - [`bulk`]: the bulk-transfer engine (UDP and TCP senders and receivers, plain,
//!   batched, GSO, GRO, zerocopy, paced) used by `netlane bench udp-bulk`;
//! - [`lb`]: the XDP load balancer driver (data plane loading, live configuration,
//!   classifier tags, statistics) around the sans-IO core in `netlane-lb`;
//! - [`nvme`]: NVMe/TCP in user space: the target server, the host, and the `perf` load
//!   generator, around the sans-IO protocol core in `netlane-nvme`;
//! - [`metrics`]: HDR histograms, CPU accounting (per thread, per process and
//!   system-wide from `/proc/stat`), rates;
//! - [`topology`]: network namespaces, veth pairs, addresses, device knobs and qdiscs,
//!   created over netlink and removed again by RAII guards.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bulk;
pub mod lb;
pub mod metrics;
pub mod nvme;
pub mod pace;
pub mod probe;
pub mod sockopt;
pub mod time;
pub mod topology;
pub mod udp;
pub mod zerocopy;
