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
//! - [`memory`]: what a server may take, checked against what the machine has first;
//! - [`caps`]: the capabilities a feature needs, checked first so a refusal names them;
//! - [`cpus`]: one CPU-list syntax (`0-3,5`), pinning, CPU counts;
//! - [`error`]: one error shape for a failed operation (the cause said once, through
//!   `source()`), and [`error::chain`] to print an error with its causes;
//! - [`lanes`]: application device queues in software: which worker owns which
//!   receive queue, the kernel's queue and NAPI map, busy-poll policies;
//! - [`serve`]: what every server is built of: the stop signal that wakes its loops;
//! - [`metrics`]: HDR histograms, CPU accounting (per thread, per process and
//!   system-wide from `/proc/stat`), rates;
//! - [`topology`]: network namespaces, veth pairs, addresses, device knobs and qdiscs,
//!   created over netlink and removed again by RAII guards;
//!
//! Each system (NVMe/TCP, the load balancer, ...) is a crate of its own on top of this
//! one; the lab (`netlane-lab`) measures them. See `docs/architecture.md`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod caps;
pub mod cpus;
pub mod error;
pub mod files;
pub mod installed;
pub mod lanes;
pub mod memory;
pub mod metrics;
pub mod nic;
pub mod pace;
pub mod probe;
pub mod ratelimit;
pub mod serve;
pub mod sockopt;
pub mod time;
pub mod topology;
pub mod udp;
pub mod zerocopy;

pub use netlane_counters::counters;
