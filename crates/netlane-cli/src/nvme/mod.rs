//! `netlane nvme target` and `netlane nvme perf`: arguments in, library calls, output.

use anyhow::Result;
use clap::Subcommand;

mod perf;
mod target;

pub use self::perf::PerfArgs;
pub use self::target::TargetArgs;

/// NVMe/TCP target and host.
#[derive(Debug, Subcommand)]
pub enum NvmeCmd {
    /// Serve namespaces over NVMe/TCP until SIGINT/SIGTERM (or --time); then print the
    /// final counters and exit 0.
    Target(Box<TargetArgs>),
    /// Connect to a target and run a fio-like workload (fio's option names work too).
    Perf(Box<PerfArgs>),
}

fn parse_size_u32(s: &str) -> Result<u32, String> {
    let v = netlane::metrics::units::parse_size(s).map_err(|e| e.to_string())?;
    u32::try_from(v).map_err(|_| format!("{s} is too large"))
}

/// Runs `netlane nvme ...`.
pub fn run(cmd: NvmeCmd) -> Result<u8> {
    match cmd {
        NvmeCmd::Target(a) => a.run(),
        NvmeCmd::Perf(a) => a.run(),
    }
}
