//! `netlane bench <scenario>`: one lab scenario with the options given.

use anyhow::Result;
use clap::{Args, Subcommand};
use netlane_lab::progress::Reporter;
use netlane_lab::scenarios::kv::KvBenchArgs;
use netlane_lab::scenarios::lanes::LanesBenchArgs;
use netlane_lab::scenarios::lb_pps::LbPpsArgs;
use netlane_lab::scenarios::nvme::NvmeBenchArgs;
use netlane_lab::scenarios::rr::RrBenchArgs;
use netlane_lab::scenarios::soak::SoakArgs;
use netlane_lab::scenarios::udp_bulk::UdpBulkArgs;
use netlane_lab::scenarios::udp_pacing::UdpPacingArgs;
use netlane_lab::scenarios::{self, Scenario};
use netlane_report::terminal;

use crate::out::{self, EXIT_STRICT, OutputArgs, StrictArg};

/// A scenario's options and what to do with its results.
#[derive(Debug, Args)]
pub struct Bench<T: Args> {
    #[command(flatten)]
    scenario: T,
    #[command(flatten)]
    out: OutputArgs,
    #[command(flatten)]
    strict: StrictArg,
}

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// UDP bulk transfer: TCP, plain UDP, sendmmsg, GSO, GSO+GRO, zerocopy, paced; vs the kernel's sender.
    UdpBulk(Box<Bench<UdpBulkArgs>>),
    /// Pacing release quantum vs loss and sender CPU at a bottleneck.
    UdpPacing(Box<Bench<UdpPacingArgs>>),
    /// NVMe/TCP: QD1 latency, QD32 IOPS per core, mixed-workload queue maps.
    Nvme(Box<Bench<NvmeBenchArgs>>),
    /// XDP load balancer packets per second per core: hints off/on, 1 to 1M flows, vs XDP_TX.
    LbPps(Box<Bench<LbPpsArgs>>),
    /// Datagram request/response: receive paths, TPACKET_V3 blocks, the wall, 8 KiB responses.
    Rr(Box<Bench<RrBenchArgs>>),
    /// Memcached-protocol cache against memcached: throughput within a tail-latency SLA.
    Kv(Box<Bench<KvBenchArgs>>),
    /// Lanes: connections on the thread that owns their receive queue (NAPI-id hand-off, reuseport BPF, busy polling) vs plain workers and memcached -N.
    Lanes(Box<Bench<LanesBenchArgs>>),
    /// Soak: each server under valid load beside hostile clients (memory, descriptors, tail latency, data after kill -9).
    Soak(Box<Bench<SoakArgs>>),
}

fn bench<T: Args + Scenario>(b: &Bench<T>) -> Result<u8> {
    b.out.validate()?;
    b.scenario.validate()?;
    let progress = Reporter::new();
    let results = scenarios::run_all(&[&b.scenario], &progress, |_| Ok(()))?;
    let doc = netlane_report::document("bench", results);
    if !b.out.json_to_stdout() {
        out::print(&terminal::results(&doc.body));
    }
    b.out.write_results(&doc)?;
    Ok(if b.strict.strict && doc.body.summary.strict_failures() > 0 { EXIT_STRICT } else { 0 })
}

/// Runs `netlane bench ...`.
pub fn run(cmd: BenchCmd) -> Result<u8> {
    match cmd {
        BenchCmd::UdpBulk(b) => bench(&b),
        BenchCmd::UdpPacing(b) => bench(&b),
        BenchCmd::Nvme(b) => bench(&b),
        BenchCmd::LbPps(b) => bench(&b),
        BenchCmd::Rr(b) => bench(&b),
        BenchCmd::Kv(b) => bench(&b),
        BenchCmd::Lanes(b) => bench(&b),
        BenchCmd::Soak(b) => bench(&b),
    }
}
