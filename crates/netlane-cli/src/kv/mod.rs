//! `netlane kv`: the memcached-protocol cache (`serve`, with memcached's options in
//! `memcached_options`) and its load generator (`load`).

mod agents;
mod load;
mod memcached_options;
mod serve;

use anyhow::Result;
use clap::Subcommand;
use netlane::metrics::units::parse_size;

pub use load::LoadArgs;
pub use serve::ServeArgs;

/// The memcached-protocol cache.
#[derive(Debug, Subcommand)]
pub enum KvCmd {
    /// Serve memcached's text, meta and binary protocols (TCP; UDP with -U; a Unix
    /// socket with -s), a drop-in for memcached 1.6.18 (docs/memcached.md), until
    /// SIGINT/SIGTERM (or --time or a permitted `shutdown`); then print the final
    /// counters and exit 0.
    Serve(Box<ServeArgs>),
    /// Load any memcached-protocol server: open loop (Poisson, constant or ETC arrivals
    /// from a precomputed schedule, latency from the scheduled send time) or closed
    /// loop; with --search, the highest rate that holds an SLA.
    Load(Box<LoadArgs>),
}

/// Runs a `kv` command.
pub fn run(cmd: KvCmd) -> Result<u8> {
    match cmd {
        KvCmd::Serve(a) => a.run(),
        KvCmd::Load(a) => a.run(),
    }
}

/// A size; a bare number is MiB (memcached's `-m 64`).
pub(super) fn megabytes(s: &str) -> Result<u64, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let m: u64 = s.parse().map_err(|_| format!("{s}: not a number"))?;
        return m.checked_mul(1 << 20).ok_or_else(|| format!("{s} MiB is too large"));
    }
    parse_size(s).map_err(|e| e.to_string())
}
