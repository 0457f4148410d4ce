//! The balancer's sans-IO control-plane core: no sockets, no BPF, no clocks.
//!
//! - [`maglev`]: weighted Maglev rings that honour weights, and how many slots move
//!   between two rings;
//! - [`config`]: the TOML configuration of VIPs and reals, validated, and the per-VIP
//!   effect of a configuration change;
//! - [`plane`]: the data plane operations a configuration change needs (VIP and real
//!   indexes, real generations, safe ordering), and per-flow tag ids.
//!
//! The data plane (BPF C under `crates/netlane-sys/bpf/lb/`) and the driver that loads
//! it and fills its maps ([`crate::Lb`]) consume what this module computes.

pub mod config;
pub mod maglev;
pub mod plane;
