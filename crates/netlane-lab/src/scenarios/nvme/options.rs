//! The nvme scenario's options: its parts and `netlane bench nvme`'s arguments, their
//! defaults, and what is checked of them before anything is built.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

use crate::scenarios::from_words;
use crate::scenarios::net::PathKind;
use netlane_report::options::{parse_duration, parse_positive_duration, parse_size};

/// Parts of the NVMe scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// QD1 latency: I/O worker vs direct send vs polling.
    Qd1,
    /// QD32 IOPS per host core: no batching vs batching vs caravans.
    Qd32,
    /// 16 QD1 readers + a QD32 1 MiB writer: shared vs separate queue maps.
    Mixed,
    /// Queue-CPU affinity: I/O workers on the submitting CPU vs the other one.
    Affinity,
    /// Caravans vs batching over request sizes and job counts.
    Caravans,
    /// QD1 completions by interrupts (moderated or not), by spinning, and by the
    /// kernel's busy polling (alone, with interrupts deferred, with IRQs suspended).
    Polling,
    /// The target's connections on the reactor owning their receive queue (lanes) vs
    /// dealt to its reactors in turn, from several hosts over a two-queue veth.
    Lanes,
}

impl Part {
    pub(super) fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// Options of the `nvme` scenario.
#[derive(Debug, Clone, Args)]
pub struct NvmeBenchArgs {
    /// Where host and target run.
    #[arg(long, value_enum, default_value_t = PathKind::Veth)]
    pub path: PathKind,
    /// Measured time per run.
    #[arg(short = 't', long, default_value = "4s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Warm-up before each measurement.
    #[arg(long, alias = "ramp_time", default_value = "500ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// CPU of the host side (jobs, queue workers, the host end's NAPI) [default: the CPU
    /// plan's generator CPU].
    #[arg(long, default_value_t = crate::plan::default_cpu(crate::plan::Role::Generator), hide_default_value = true)]
    pub host_cpu: usize,
    /// CPU of the target (its reactor and its end's NAPI) [default: the CPU plan's server
    /// CPU].
    #[arg(long, default_value_t = crate::plan::default_cpu(crate::plan::Role::Server), hide_default_value = true)]
    pub target_cpu: usize,
    /// Parts to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "qd1,qd32,mixed,affinity,caravans,polling,lanes")]
    pub parts: Vec<Part>,
    /// Target memory namespace size.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub ns_size: u64,
    /// Rounds: every mode runs once per round, in a rotating order; checks pair the modes
    /// they compare within each round. The mixed part runs at least 5 unless this is 1.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// MTU of the veth pair (storage networks usually run jumbo frames).
    #[arg(long, default_value_t = 9000, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
    /// Request sizes of the caravan sweep (comma separated; 512 to 128K, multiples of 512).
    #[arg(long, value_delimiter = ',', default_value = "512,4K,32K,128K", value_parser = parse_sweep_size)]
    pub caravan_sizes: Vec<u32>,
    /// The testbed it runs on (none: this machine). The target runs on its server host,
    /// nvme perf on its first client host; --host-cpu then names a CPU there.
    #[command(flatten)]
    pub on: crate::testbed::TestbedArgs,
}

/// A caravan sweep request size: 512 bytes to 128 KiB, whole 512-byte blocks.
fn parse_sweep_size(s: &str) -> Result<u32, String> {
    let v = parse_size(s)?;
    if !(512..=128 << 10).contains(&v) || v % 512 != 0 {
        return Err(format!("{s}: a request size is 512 to 128K, in whole 512-byte blocks"));
    }
    Ok(v as u32)
}

/// A sweep request size as the options, job specs and report write it (`512`, `4K`,
/// `1536`): exact, so that the job asks for the size the sweep names.
pub(super) fn size_name(bs: u32) -> String {
    netlane::metrics::units::format_size(u64::from(bs))
}

impl NvmeBenchArgs {
    /// The defaults, as `netlane bench nvme` has them.
    pub fn defaults() -> NvmeBenchArgs {
        from_words(&[]).expect("the defaults parse")
    }

    /// The options against this machine: CPUs that exist, something to run, a namespace
    /// the mixed workload fits in, and root for the veth path.
    pub(super) fn validate_options(&self) -> Result<()> {
        let n = netlane::cpus::online_count();
        // On a testbed the CPUs are its hosts' (checked there).
        let here = [("--host-cpu", self.host_cpu), ("--target-cpu", self.target_cpu())];
        for (what, c) in if self.on.testbed.is_none() { &here[..] } else { &[] } {
            if *c >= n {
                bail!("{what} {c}: this machine has CPUs 0-{}", n - 1);
            }
        }
        if self.parts.is_empty() {
            bail!("--parts: no parts to run");
        }
        if self.parts.contains(&Part::Caravans) && self.caravan_sizes.is_empty() {
            bail!("--caravan-sizes: no request sizes to sweep");
        }
        if self.ns_size < 64 << 20 {
            bail!("--ns-size {}: at least 64M (the mixed workload's writer alone covers 32M)", self.ns_size);
        }
        if self.on.testbed.is_none() && self.path == PathKind::Veth && !netlane::topology::have_privileges() {
            bail!("the veth path needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run as root or use --path loopback");
        }
        Ok(())
    }
}
