//! The kv scenario's options: the workload, the SLA search, the parts and servers.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use netlane_kv::load::schedule::Pacing;
use netlane_kv::load::stats::Sla;
use netlane_kv::load::workload::{KeyDist, SizeDist, WorkloadSpec};
use netlane_kv::loadgen::LoadConfig;
use netlane_report::options::{OptionList, parse_duration, parse_positive_duration};

use super::{Part, ServerKind};

/// The workload's options, shared by `netlane bench kv` and `netlane kv load`.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Keys in the key space (stored before the runs).
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Key popularity: uniform or zipf:S.
    #[arg(long, default_value = "uniform")]
    pub key_dist: KeyDist,
    /// Key sizes: N, uniform:A,B or etc.
    #[arg(long, default_value = "30")]
    pub key_size: SizeDist,
    /// Value sizes: N, uniform:A,B or etc.
    #[arg(long, default_value = "200")]
    pub value_size: SizeDist,
    /// Fraction of requests that are gets (the rest are sets).
    #[arg(long, default_value_t = 0.9)]
    pub get_ratio: f64,
    /// Keys per get.
    #[arg(long, default_value_t = 1)]
    pub multiget: u32,
}

impl WorkloadArgs {
    /// The workload, for a server whose largest value is `item_max` bytes.
    pub fn spec(&self, item_max: u32) -> WorkloadSpec {
        WorkloadSpec {
            keys: self.keys,
            key_dist: self.key_dist,
            key_size: self.key_size,
            value_size: self.value_size,
            get_ratio: self.get_ratio,
            multiget: self.multiget,
            item_max,
        }
    }

    /// `list` with these options echoed.
    pub fn echo(&self, list: OptionList) -> OptionList {
        list.int("keys", self.keys)
            .text("key-dist", self.key_dist.to_string())
            .text("key-size", self.key_size.to_string())
            .text("value-size", self.value_size.to_string())
            .num("get-ratio", self.get_ratio)
            .int("multiget", u64::from(self.multiget))
    }
}

/// `netlane bench kv`.
#[derive(Debug, Clone, Args)]
pub struct KvBenchArgs {
    /// Parts to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sla,rates,closed")]
    pub parts: Vec<Part>,
    /// Servers to compare.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "netlane,memcached")]
    pub servers: Vec<ServerKind>,
    /// Generator connections (the talk: 300..4400; scaled to two CPUs).
    #[arg(long, default_value_t = 200)]
    pub connections: u32,
    /// Server worker threads (memcached's -t), all on --server-cpu.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// The SLA of the sla part.
    #[arg(long, default_value = "p99.9=1ms")]
    pub sla: Sla,
    /// The tighter SLA of the sla part: a bound at p99, since a vCPU preempted now and
    /// then stalls every request in flight at p99.9, whichever server runs (the floor
    /// part measures it).
    #[arg(long, default_value = "p99=500us")]
    pub tight_sla: Sla,
    /// Lowest rate the search tries, requests/s.
    #[arg(long, default_value_t = 10_000.0)]
    pub search_lo: f64,
    /// Highest rate the search tries, requests/s.
    #[arg(long, default_value_t = 300_000.0)]
    pub search_hi: f64,
    /// The search stops when its bracket is narrower than this ratio.
    #[arg(long, default_value_t = 1.1)]
    pub resolution: f64,
    /// Length of each search run (a rate is decided by three of five, or two clear ones):
    /// long enough that one stall of the machine cannot decide a p99 alone.
    #[arg(long, default_value = "2s", value_parser = parse_positive_duration)]
    pub step: Duration,
    /// Offered rates of the rates part, requests/s (`20k,50k`).
    #[arg(long, value_delimiter = ',', default_value = "20000,50000,80000", value_parser = netlane_report::options::parse_count)]
    pub rates: Vec<u64>,
    /// Requests in flight per connection in the closed part.
    #[arg(long, default_value_t = 1)]
    pub closed_depth: u32,
    /// Length of each run of the rates and closed parts.
    #[arg(short = 't', long, default_value = "3s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Rounds: each server once per round, first in turn.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Before each server's searches, a run this long at the lowest search rate with
    /// cyclictest measuring the server CPU's stalls meanwhile: the floor under any tail
    /// latency here; 0s: not measured.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub stall_probe: Duration,
    /// CPU of the server and its end's NAPI [default: the CPU plan's server CPU].
    #[arg(long, default_value_t = crate::plan::default_cpu(crate::plan::Role::Server), hide_default_value = true)]
    pub server_cpu: usize,
    /// CPU of the load generator and its end's NAPI [default: the CPU plan's generator
    /// CPU].
    #[arg(long, default_value_t = crate::plan::default_cpu(crate::plan::Role::Generator), hide_default_value = true)]
    pub client_cpu: usize,
    /// The memcached binary.
    #[arg(long, default_value = "memcached")]
    pub memcached: String,
    /// The testbed it runs on (none: two namespaces of this machine).
    #[command(flatten)]
    pub on: crate::testbed::TestbedArgs,
}

impl KvBenchArgs {
    /// The defaults, as `netlane bench kv` has them.
    pub fn defaults() -> KvBenchArgs {
        crate::scenarios::from_words(&[]).expect("the defaults parse")
    }

    pub(super) fn workload(&self) -> WorkloadSpec {
        self.workload.spec(1 << 20)
    }

    pub(super) fn load(&self, server: SocketAddr, pacing: Pacing, duration: Duration) -> LoadConfig {
        // On a testbed the client hosts' own CPUs place the generator (or nothing does).
        let cpus = if self.on.testbed.is_some() { Vec::new() } else { vec![self.client_cpu] };
        crate::scenarios::cache::load_config(server, (self.connections, 1), cpus, pacing, self.workload(), duration)
    }

    /// Whether the floor runs measure the server CPU's stalls with cyclictest.
    pub(super) fn probes_stalls(&self) -> bool {
        self.parts.contains(&Part::Sla) && !self.stall_probe.is_zero()
    }
}
