//! netlane's XDP L4 load balancer (Katran-class): Maglev consistent hashing, IPIP and
//! IPv6 encapsulation towards the reals, and NIC metadata hints (RX hash, per-flow and
//! per-destination tags) that let marked packets skip work.
//!
//! Two layers:
//!
//! - [`proto`]: the sans-IO control-plane core (weighted Maglev, the TOML
//!   configuration, the plan of data-plane writes for a change, the tag table): no
//!   sockets, no BPF, no clocks; property-tested;
//! - the driver around it ([`Lb`]): loads the data plane built from
//!   `crates/netlane-sys/bpf/lb/`, attaches it, applies configurations live, turns
//!   new-flow events into classifier tags ([`Classifier`], [`TcClassifier`]), and
//!   reports statistics ([`stats`]) as JSON and Prometheus text.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod proto;

#[cfg(feature = "drivers")]
mod classifier;
#[cfg(feature = "drivers")]
mod driver;
#[cfg(feature = "drivers")]
pub mod server;
#[cfg(feature = "drivers")]
pub mod stats;
#[cfg(feature = "drivers")]
pub mod testnet;

#[cfg(feature = "drivers")]
pub use driver::*;
