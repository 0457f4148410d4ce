//! The rr scenario's options: its parts and `netlane bench rr`'s arguments, and the
//! checks of the arguments alone.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::PathKind as RxPathKind;

use crate::scenarios::from_words;
use netlane_report::options::{parse_duration, parse_positive_duration, parse_size_usize};

/// The blocks part's fixed ring sizes by default: those the adaptive ring chooses from
/// (`netlane_rr::server::ADAPTIVE_BLOCKS`, which a test holds this to).
pub const BLOCK_SIZES_DEFAULT: &str = "4K,8K,12K,16K,24K,32K,48K,64K,96K,128K";
/// The largest fixed block the blocks part takes (its ring is 64 of them).
pub const MAX_FIXED_BLOCK: usize = 1 << 20;

/// A part of the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Part {
    /// Every receive path at 64 clients.
    Paths,
    /// TPACKET_V3 block sizes (the adaptive ring's own), without and with a pause
    /// between requests, and the adaptive block size against the best of them.
    Blocks,
    /// Clients 1..128 on every path: throughput against latency.
    Wall,
    /// 8 KiB responses: IP fragments at MTU 1500, MTU 9000, GSO segments.
    Large,
    /// Transmit paths (UDP socket, packet ring, AF_XDP) with 1 and 8 KiB responses.
    Tx,
    /// Responses released in blocks, unpaced and paced: the clients woken together.
    Pace,
    /// recvmmsg and AF_XDP with and without busy polling (`--busy-poll`), at an
    /// open-loop load (`--busy-load`).
    Busy,
    /// Every receive path on a device with several receive queues (the lab's veth: two),
    /// the clients' flows spread over them by hash; AF_XDP with a socket per queue.
    Queues,
    /// The TCP comparator: the same requests and answers over a TCP connection per
    /// client beside UDP's recvmmsg, from 1 to 128 clients, and 8 KiB responses at MTU
    /// 1500 and 9000 over both.
    Tcp,
}

impl Part {
    pub(super) fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// `netlane bench rr`.
#[derive(Debug, Clone, Args)]
pub struct RrBenchArgs {
    /// Parts to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "paths,blocks,wall,large,tx,pace,busy,queues,tcp")]
    pub parts: Vec<Part>,
    /// Receive paths for the paths and wall parts.
    #[arg(long, value_delimiter = ',', default_value = "recvfrom,recvmmsg,tpacket-v2,tpacket-v3,af-xdp")]
    pub paths: Vec<RxPathKind>,
    /// Clients in the paths part (each with its own socket).
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Request size in bytes (header included).
    #[arg(long, default_value_t = 512)]
    pub request: usize,
    /// Response size in bytes in the paths, blocks and wall parts (the large part uses 8 KiB).
    #[arg(long, default_value_t = 1024)]
    pub response: usize,
    /// Client think time between a response and the next request (all parts but blocks).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub think: Duration,
    /// Client think times of the blocks part: none (the talk's sweep, the server never
    /// idle) and one pause (its trade-off between idle CPU and throughput needs a server
    /// that can be idle). At most one pause besides 0s.
    #[arg(long, value_delimiter = ',', default_value = "0s,3ms", value_parser = parse_duration)]
    pub block_thinks: Vec<Duration>,
    /// Client counts of the blocks part (the adaptive targets hold across them).
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128")]
    pub block_clients: Vec<usize>,
    /// TPACKET_V3 block sizes of the blocks part's fixed rings [default: the sizes the
    /// adaptive ring chooses from].
    #[arg(long, value_delimiter = ',', default_value = BLOCK_SIZES_DEFAULT, value_parser = parse_size_usize)]
    pub block_sizes: Vec<usize>,
    /// TPACKET_V3 requests per block in the paths and wall parts.
    #[arg(long, default_value_t = 16)]
    pub block: u32,
    /// TPACKET_V3 block retire timeout, milliseconds.
    #[arg(long, default_value_t = 8)]
    pub retire_ms: u32,
    /// Open-loop request rate of the pace part (Poisson arrivals over the clients).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub pace_load: u64,
    /// Paced rate of the pace part, as a multiple of --pace-load (above 1: the schedule
    /// spreads bursts without throttling the load).
    #[arg(long, default_value_t = 1.25)]
    pub pace_headroom: f64,
    /// Busy polling of the busy part: USECS, USECS,BUDGET or USECS,BUDGET,prefer.
    #[arg(long, default_value = "50,8")]
    pub busy_poll: netlane::lanes::BusyPoll,
    /// Open-loop request rate of the busy part (Poisson arrivals over the clients): a
    /// server that is never idle never polls.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub busy_load: u64,
    /// Measured time per run.
    #[arg(short = 't', long, default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Warm-up before each measurement.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// Rounds: every mode once per round, in a rotating order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// CPU of the server thread and its end's NAPI [default: the CPU plan's server CPU].
    #[arg(long, default_value_t = crate::plan::default_cpu(crate::plan::Role::Server), hide_default_value = true)]
    pub server_cpu: usize,
    /// CPU of the clients and their end's NAPI [default: the CPU plan's generator CPU].
    #[arg(long, default_value_t = crate::plan::default_cpu(crate::plan::Role::Generator), hide_default_value = true)]
    pub client_cpu: usize,
    /// CPUs of the paths part's throughput comparison's clients, a thread on each (it
    /// runs where there are two) [default: every CPU but the server's].
    #[arg(long)]
    pub client_cpus: Option<netlane::cpus::CpuList>,
    /// MTU of the veth pair for every part but large (which uses 1500 and 9000).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
    /// The testbed it runs on (none: two namespaces of this machine).
    #[command(flatten)]
    pub on: crate::testbed::TestbedArgs,
}

impl RrBenchArgs {
    /// The defaults, as `netlane bench rr` has them.
    pub fn defaults() -> RrBenchArgs {
        from_words(&[]).expect("the defaults parse")
    }

    /// The smallest fixed block of the blocks part that holds half the burst of
    /// `clients` that do not pause (each has a request waiting).
    pub(super) fn half_burst_block(&self, clients: usize) -> Option<usize> {
        let mut sizes = self.block_sizes.clone();
        sizes.sort_unstable();
        sizes.into_iter().find(|b| super::plan::block_holds(*b, self.request) >= clients / 2)
    }

    /// The arguments' own checks: CPUs this machine has, sizes, counts and ranges.
    pub(super) fn check_arguments(&self) -> Result<()> {
        let n = netlane::cpus::online_count();
        // On a testbed the CPUs are its hosts' (checked there).
        let here = if self.on.testbed.is_none() {
            &[("--server-cpu", self.server_cpu), ("--client-cpu", self.client_cpu)][..]
        } else {
            &[]
        };
        for &(what, c) in here {
            if c >= n {
                bail!("{what} {c}: this machine has CPUs 0-{}", n - 1);
            }
        }
        if self.parts.is_empty() {
            bail!("--parts: no parts to run");
        }
        if let Some(c) = &self.client_cpus {
            if self.on.testbed.is_some() {
                bail!("--client-cpus: on a testbed the client hosts' own CPUs place the clients");
            }
            c.check_online().map_err(|e| anyhow::anyhow!("--client-cpus: {e}"))?;
            if c.as_slice().contains(&self.server_cpu) {
                bail!("--client-cpus {c}: the server's CPU {} is not the clients'", self.server_cpu);
            }
        }
        if self.paths.is_empty() && self.parts.iter().any(|p| matches!(p, Part::Paths | Part::Wall | Part::Queues)) {
            bail!("--paths: no receive paths");
        }
        if !(HEADER_LEN..=1472).contains(&self.request) {
            bail!("--request {}: {HEADER_LEN}..=1472 bytes (one unfragmented datagram at MTU 1500)", self.request);
        }
        if !(HEADER_LEN..=65_507).contains(&self.response) {
            bail!("--response {}: {HEADER_LEN}..=65507 bytes", self.response);
        }
        if !(1..=4096).contains(&self.clients) {
            bail!("--clients {}: 1..=4096", self.clients);
        }
        if !(self.pace_headroom.is_finite() && (1.0..=10.0).contains(&self.pace_headroom)) {
            bail!("--pace-headroom {}: 1 to 10 (the paced rate over the offered load)", self.pace_headroom);
        }
        if self.parts.contains(&Part::Blocks) && self.block_clients.is_empty() {
            bail!("--block-clients: no client counts for the blocks part");
        }
        if let Some(c) = self.block_clients.iter().find(|c| !(1..=4096).contains(*c)) {
            bail!("--block-clients {c}: 1..=4096");
        }
        if let Some(c) =
            self.block_clients.iter().enumerate().find_map(|(i, c)| self.block_clients[..i].contains(c).then_some(c))
        {
            bail!("--block-clients: {c} appears twice");
        }
        if self.parts.contains(&Part::Blocks) && self.block_thinks.is_empty() {
            bail!("--block-thinks: no think times for the blocks part");
        }
        if self.block_thinks.iter().filter(|t| !t.is_zero()).count() > 1 {
            bail!("--block-thinks: at most one pause besides 0s");
        }
        if self.block_thinks.iter().filter(|t| t.is_zero()).count() > 1 {
            bail!("--block-thinks: 0s appears twice");
        }
        if let Some(t) = self.block_thinks.iter().find(|t| **t > Duration::from_secs(1)) {
            bail!("--block-thinks {}: at most 1s", netlane::metrics::units::format_duration(*t));
        }
        if self.parts.contains(&Part::Blocks) && self.block_sizes.is_empty() {
            bail!("--block-sizes: no block sizes for the blocks part");
        }
        let page = netlane_sys::packet::page_size();
        for &b in &self.block_sizes {
            if !(page..=MAX_FIXED_BLOCK).contains(&b) || b % page != 0 || b % 2048 != 0 {
                bail!(
                    "--block-sizes {b}: a block is whole pages and 2 KiB frames, {} KiB to {} KiB",
                    page / 1024,
                    MAX_FIXED_BLOCK / 1024
                );
            }
        }
        if let Some(b) =
            self.block_sizes.iter().enumerate().find_map(|(i, b)| self.block_sizes[..i].contains(b).then_some(b))
        {
            bail!("--block-sizes: {b} appears twice");
        }
        if !(1..=4096).contains(&self.block) {
            bail!("--block {}: 1..=4096 requests per block", self.block);
        }
        Ok(())
    }
}
