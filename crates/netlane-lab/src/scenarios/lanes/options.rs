//! The lanes scenario's options: its modes and `netlane bench lanes`'s arguments.

use std::time::Duration;

use anyhow::Result;
use clap::{Args, ValueEnum};
use netlane::lanes::BusyPoll;
use netlane_kv::load::stats::Sla;
use serde::Serialize;

use crate::scenarios::kv::WorkloadArgs;
use netlane_report::options::parse_positive_duration;

/// How connections are placed on threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// netlane, workers dealt connections round robin (no alignment).
    Plain,
    /// The unmodified application's ADQ: workers dealt connections round robin, each
    /// worker's epoll busy polling, transmit queues paired with receive queues
    /// (`xps_rxqs`); no NAPI-id placement.
    PlainBusy,
    /// The kernel's own steering: workers dealt connections round robin, with receive
    /// flow steering (RFS) taking each flow's protocol work to its worker's CPU.
    Rfs,
    /// netlane lanes, NAPI-id hand-off by the acceptor.
    Napi,
    /// netlane lanes, hand-off and per-epoll busy polling.
    NapiBusy,
    /// netlane lanes, NAPI-id hand-off, each queue's NAPI thread busy polling (where the
    /// kernel has threaded busy polling).
    ThreadedBusy,
    /// netlane lanes, the reuseport BPF selector.
    Reuseport,
    /// memcached 1.6.18.
    Memcached,
    /// memcached 1.6.18 with -N (NAPI ids) and the busy_poll sysctl.
    MemcachedN,
}

impl Mode {
    pub(crate) fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }

    pub(crate) fn is_memcached(self) -> bool {
        matches!(self, Mode::Memcached | Mode::MemcachedN)
    }

    /// Whether its server's lanes own the device's NAPI instances.
    pub(crate) fn lane_device(self) -> bool {
        matches!(self, Mode::Napi | Mode::NapiBusy | Mode::Reuseport | Mode::PlainBusy | Mode::ThreadedBusy)
    }

    /// Why it runs only where the lab runs (a setting the lab makes on this machine), if
    /// it does.
    pub(crate) fn this_machine_only(self) -> Option<&'static str> {
        match self {
            Mode::MemcachedN => Some("its net.core.busy_poll is global: this machine's to set"),
            Mode::Rfs => Some("its net.core.rps_sock_flow_entries is global: this machine's to set"),
            Mode::ThreadedBusy => Some("the lab sets its NAPI threads on this machine's veth"),
            _ => None,
        }
    }

    /// Whether something of it busy polls (and so spins on a CPU): its workers, or its
    /// NAPI threads.
    pub(crate) fn busy_polls(self) -> bool {
        matches!(self, Mode::NapiBusy | Mode::PlainBusy | Mode::ThreadedBusy)
    }
}

/// `netlane bench lanes`.
#[derive(Debug, Clone, Args)]
pub struct LanesBenchArgs {
    /// Modes to run (comma separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "plain,plain-busy,rfs,napi,napi-busy,threaded-busy,reuseport,memcached,memcached-n"
    )]
    pub modes: Vec<Mode>,
    /// Connection counts of the fixed-rate runs (the talk: 300..4400, scaled to two CPUs);
    /// the search uses the first.
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    pub connections: Vec<u32>,
    /// The connection sweep: the plain and napi modes' SLA search again at each of these
    /// counts (beside the search's own, the first of --connections).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096")]
    pub sweep_connections: Vec<u32>,
    /// Skip the connection sweep.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_sweep: bool,
    /// Offered rates of the fixed-rate runs, requests/s (`10k,20k`).
    #[arg(long, value_delimiter = ',', default_value = "10000,20000", value_parser = netlane_report::options::parse_count)]
    pub rates: Vec<u64>,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// The SLA of the search (at p99: the kv scenario's floor part says why).
    #[arg(long, default_value = "p99=500us")]
    pub sla: Sla,
    /// Lowest rate the search tries, requests/s.
    #[arg(long, default_value_t = 10_000.0)]
    pub search_lo: f64,
    /// Highest rate the search tries, requests/s.
    #[arg(long, default_value_t = 150_000.0)]
    pub search_hi: f64,
    /// The search stops when its bracket is narrower than this ratio.
    #[arg(long, default_value_t = 1.15)]
    pub resolution: f64,
    /// Length of each search run.
    #[arg(long, default_value = "2s", value_parser = parse_positive_duration)]
    pub step: Duration,
    /// Busy polling of the napi-busy and plain-busy modes: USECS, USECS,BUDGET or
    /// USECS,BUDGET,prefer.
    #[arg(long, default_value = "50,8")]
    pub busy_poll: BusyPoll,
    /// The rfs mode's flow table: entries of net.core.rps_sock_flow_entries (global),
    /// shared out as each receive queue's rps_flow_cnt.
    #[arg(long, default_value_t = 32768, value_parser = clap::value_parser!(u32).range(1..=1 << 26))]
    pub rfs_flows: u32,
    /// napi-busy and plain-busy: per-NAPI empty polls before interrupts are re-enabled (with
    /// --gro-flush-timeout, the lane's polling keeps the NAPI thread asleep).
    #[arg(long)]
    pub napi_defer_hard_irqs: Option<u32>,
    /// napi-busy and plain-busy: per-NAPI GRO flush / watchdog timeout.
    #[arg(long, value_parser = parse_positive_duration)]
    pub gro_flush_timeout: Option<Duration>,
    /// napi-busy and plain-busy: per-NAPI IRQ suspension timeout (Linux 6.13+; needs prefer in
    /// --busy-poll).
    #[arg(long, value_parser = parse_positive_duration)]
    pub irq_suspend_timeout: Option<Duration>,
    /// net.core.busy_poll for memcached -N, us (it polls only through the global knob).
    #[arg(long, default_value_t = 50)]
    pub memcached_busy_poll: u32,
    /// Length of each fixed-rate run.
    #[arg(short = 't', long, default_value = "3s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Rounds: each mode once per round, in rotating order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Skip the search (fixed rates only).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_search: bool,
    /// The memcached binary.
    #[arg(long, default_value = "memcached")]
    pub memcached: String,
    /// Skip the isolation part (the cache beside a bulk sender, with and without
    /// per-application classes).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_isolation: bool,
    /// The isolation part's link rate (an htb root class on the server's egress).
    #[arg(long, default_value = "1gbit", value_parser = parse_link_rate)]
    pub isolation_link: u64,
    /// The cache's offered rate in the isolation part, requests/s.
    #[arg(long, default_value_t = 5000)]
    pub isolation_rate: u64,
    /// The cache's connections in the isolation part.
    #[arg(long, default_value_t = 32)]
    pub isolation_connections: u32,
    /// Across machines: the server on the testbed's server host, one lane per CPU the
    /// file gives it, its `iface` the lane device (its NAPI and interrupts as the file's
    /// `threaded` and `irqs` leave them); the load from the client hosts. memcached -N
    /// and the isolation part stay on one machine.
    #[command(flatten)]
    pub on: crate::testbed::TestbedArgs,
}

pub(crate) fn parse_link_rate(s: &str) -> Result<u64, String> {
    netlane::metrics::units::parse_rate(s).map_err(|e| e.to_string())
}
