//! Benchmarks: each builds its network, runs its modes side by side, and returns a
//! [`ScenarioReport`](crate::report::ScenarioReport).

pub mod lb_pps;
pub mod nvme;
pub mod selftest;
pub mod udp_bulk;
pub mod udp_pacing;

use std::time::Duration;

use crate::engines::bulk::{BulkError, BulkResult, BulkRun, Endpoints, SenderProcess, TxSource, TxSpec};
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

/// The hidden subcommand a sender process runs (see `crate::engines::bulk::run_sender_job`).
pub const SENDER_SUBCOMMAND: &str = "__bulk-tx";
use netlane::metrics::units::{self, format_duration};
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};

/// Where the sender and the receiver run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PathKind {
    /// Two network namespaces joined by a veth pair (needs root).
    Veth,
    /// Loopback in the current namespace (no root needed; no NAPI, no GRO coalescing).
    Loopback,
}

/// Receive-side NAPI of the veth's receiving end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RxNapi {
    /// GRO on and NAPI in a kernel thread pinned to `--napi-cpu` (like a NIC).
    Threaded,
    /// veth defaults: receive work runs on the sender's CPU, no GRO batching.
    Off,
}

/// Where netlane's sender runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SenderPlacement {
    /// In a child process of its own, single-threaded and measured with wait4, like
    /// the kernel's selftest sender (and like a sending host apart from the receiver).
    Process,
    /// On a thread of the benchmark process (shares the file table with the receiver,
    /// which costs every system call an atomic reference count).
    Thread,
}

/// Options every network benchmark shares.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// Where sender and receiver run.
    #[arg(long, value_enum, default_value_t = PathKind::Veth)]
    pub path: PathKind,
    /// Use IPv6 instead of IPv4.
    #[arg(short = '6', long)]
    pub ipv6: bool,
    /// MTU of the veth pair.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
    /// Receive-side NAPI of the veth.
    #[arg(long, value_enum, default_value_t = RxNapi::Threaded)]
    pub rx_napi: RxNapi,
    /// CPU for the sender.
    #[arg(long, default_value_t = 0)]
    pub tx_cpu: usize,
    /// Where netlane's sender runs.
    #[arg(long, value_enum, default_value_t = SenderPlacement::Process)]
    pub sender: SenderPlacement,
    /// CPU for the receiver thread (default: 1, or 0 on a 1-CPU machine).
    #[arg(long)]
    pub rx_cpu: Option<usize>,
    /// CPU for the receiving veth's NAPI thread (default: the receiver's CPU, so the
    /// sender's CPU does only sending, as on two machines).
    #[arg(long)]
    pub napi_cpu: Option<usize>,
}

impl NetArgs {
    /// Checks CPU numbers against this machine.
    pub fn validate(&self) -> Result<()> {
        let n = cpus();
        for (what, cpu) in [("--tx-cpu", Some(self.tx_cpu)), ("--rx-cpu", self.rx_cpu), ("--napi-cpu", self.napi_cpu)] {
            if let Some(c) = cpu
                && c >= n
            {
                bail!("{what} {c}: this machine has CPUs 0..={}", n - 1);
            }
        }
        Ok(())
    }

    /// The receiver's CPU.
    pub fn rx_cpu(&self) -> usize {
        self.rx_cpu.unwrap_or(if cpus() > 1 { 1 } else { 0 })
    }

    /// The veth link configuration.
    pub fn link(&self) -> LinkConfig {
        let rx = match self.rx_napi {
            RxNapi::Threaded => RxTuning::threaded_napi_on(self.napi_cpu.unwrap_or(self.rx_cpu())),
            RxNapi::Off => RxTuning::none(),
        };
        LinkConfig { mtu: self.mtu, queues: 1, rx }
    }

    /// Path MTU the datagrams must fit.
    pub fn path_mtu(&self) -> u32 {
        match self.path {
            PathKind::Veth => self.mtu,
            PathKind::Loopback => 65_536,
        }
    }

    /// `key=value` pairs for the echo.
    pub fn echo(&self, out: &mut Vec<(String, String)>) {
        out.push(("path".into(), format!("{:?}", self.path).to_lowercase()));
        out.push(("family".into(), if self.ipv6 { "ipv6" } else { "ipv4" }.into()));
        if self.path == PathKind::Veth {
            let link = self.link();
            out.push(("mtu".into(), self.mtu.to_string()));
            out.push(("rx_tuning".into(), link.rx.label()));
        }
        out.push(("sender".into(), format!("{:?}", self.sender).to_lowercase()));
        out.push(("tx_cpu".into(), self.tx_cpu.to_string()));
        out.push(("rx_cpu".into(), self.rx_cpu().to_string()));
        out.push(("cpus".into(), cpus().to_string()));
    }

    /// netlane's sender for `spec`, placed as `--sender` says.
    pub fn sender(&self, spec: TxSpec) -> TxSource {
        match self.sender {
            SenderPlacement::Thread => TxSource::Netlane(spec),
            SenderPlacement::Process => match std::env::current_exe() {
                Ok(program) => TxSource::Process(spec, SenderProcess { program, args: vec![SENDER_SUBCOMMAND.into()] }),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot find the netlane binary; the sender runs on a thread");
                    TxSource::Netlane(spec)
                }
            },
        }
    }

    /// Builds the veth topology when the path needs one.
    pub fn build(&self, label: &str) -> Result<Option<TwoHosts>> {
        match self.path {
            PathKind::Loopback => Ok(None),
            PathKind::Veth => Ok(Some(TwoHosts::create(label, self.link()).context("building the veth topology")?)),
        }
    }
}

/// Endpoints for an optional topology.
pub fn endpoints(hosts: &Option<TwoHosts>) -> Endpoints<'_> {
    match hosts {
        Some(h) => Endpoints::Veth(h),
        None => Endpoints::Loopback,
    }
}

/// Runs one transfer, with the run's label in any error.
pub fn run_one(hosts: &Option<TwoHosts>, label: &str, run: &BulkRun) -> Result<BulkResult> {
    crate::engines::bulk::run(endpoints(hosts), run).map_err(|e| match e {
        BulkError::Config(m) => anyhow::anyhow!("{label}: {m}"),
        other => anyhow::Error::new(other).context(format!("{label} run failed")),
    })
}

/// Number of CPUs available to this process.
pub fn cpus() -> usize {
    netlane::cpus::online_count()
}

/// clap parser for rates (`10MB/s`, `200mbit`); rejects zero and negative values.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    units::parse_rate(s).map_err(|e| e.to_string())
}

/// clap parser for durations; rejects zero.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = units::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!("duration {s:?}: must be positive"));
    }
    Ok(d)
}

/// clap parser for sizes (`64k`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

/// A pacing quantum on the command line: `auto` or a duration.
pub fn parse_quantum(s: &str) -> Result<netlane::pace::Quantum, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(netlane::pace::Quantum::Auto);
    }
    let d = parse_positive_duration(s)?;
    Ok(netlane::pace::Quantum::Fixed(d.as_nanos() as u64))
}

/// Human form of a quantum.
pub fn quantum_label(q: netlane::pace::Quantum) -> String {
    match q {
        netlane::pace::Quantum::Auto => "auto".into(),
        netlane::pace::Quantum::Fixed(ns) => format_duration(Duration::from_nanos(ns)),
    }
}

/// How a benchmark reports progress: the CLI prints lines, the lab draws bars.
pub trait Progress {
    /// `total` runs are planned.
    fn plan(&self, total: usize);
    /// A run starts.
    fn start(&self, label: &str);
    /// A run finished; `summary` is one line.
    fn finish(&self, label: &str, summary: &str);
}

/// Progress as lines on stderr.
#[derive(Debug, Default)]
pub struct LineProgress;

impl Progress for LineProgress {
    fn plan(&self, total: usize) {
        eprintln!("# {total} runs");
    }
    fn start(&self, _label: &str) {}
    fn finish(&self, label: &str, summary: &str) {
        eprintln!("# {label}: {summary}");
    }
}

/// One-line summary of a run for progress output.
pub fn summary_line(r: &BulkResult) -> String {
    format!(
        "tx {} rx {} | tx {:.3} s/GB | loss {:.2}%",
        units::Rate(r.tx_rate),
        units::Rate(r.rx_rate),
        r.tx_cpu_per_gb,
        r.loss * 100.0
    )
}

pub use netlane::metrics::median;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn quantum_parsing() {
        assert_eq!(parse_quantum("auto").unwrap(), netlane::pace::Quantum::Auto);
        assert_eq!(parse_quantum("250us").unwrap(), netlane::pace::Quantum::Fixed(250_000));
        assert!(parse_quantum("0ms").is_err());
        assert!(parse_quantum("soon").is_err());
    }
}
