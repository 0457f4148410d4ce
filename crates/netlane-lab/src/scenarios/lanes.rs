//! `lanes`: application device queues in software, measured on the cache server the way
//! the ADQ talk measured memcached: throughput within a tail-latency SLA, and latency
//! and the kernel's events per request at fixed loads, for each way of placing
//! connections on worker threads.
//!
//! The network: two namespaces joined by a veth with one queue per CPU, each of the
//! server end's queues served by a threaded NAPI instance pinned to its CPU (a NIC with
//! one interrupt per CPU); the generator's end sends without TSO so that TCP takes that
//! NAPI path and every server socket has a NAPI id. Replies keep TSO and skip NAPI:
//! their receive work runs in the server's send. The generator has a thread on each CPU,
//! as the server has a worker on each.
//!
//! Modes, every one in every round, in rotating order:
//! - `plain`: netlane's server, one worker per CPU, connections dealt round robin: half
//!   of them on a worker whose CPU does not run their queue;
//! - `napi`: lanes, the acceptor hands each connection to the lane owning its
//!   SO_INCOMING_NAPI_ID, the lane pinned to that queue's CPU;
//! - `napi-busy`: the same, each lane's epoll busy polling (`--busy-poll`);
//! - `reuseport`: lanes without an acceptor: the reuseport BPF selector;
//! - `memcached`, `memcached-n`: memcached 1.6.18 with two threads, without and with
//!   `-N` (its NAPI-id mode, with the global `net.core.busy_poll` it relies on, set for
//!   the run and restored after).

use std::net::{IpAddr, SocketAddr};
use std::process::Child;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use netlane::cpus::machine::CpuTopology;
use netlane::lanes::BusyPoll;
use netlane::metrics::cpu::SystemCpu;
use netlane::metrics::kstat::KernelCounters;
use netlane::topology::netdev::NapiSettings;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_kv::load::schedule::{Arrivals, Pacing, Process};
use netlane_kv::load::search::SearchConfig;
use netlane_kv::load::stats::Sla;
use netlane_kv::loadgen::{self, LoadConfig, LoadReport, SearchReport};
use netlane_kv::server::{LanesView, Server, ServerConfig, Steer};
use netlane_kv::store::StoreConfig;
use serde::Serialize;

use super::isolation::IsoRun;
use super::kv::{WorkloadArgs, memcached_command, program_exists, wait_until_accepting};
use super::{Scenario, discarded_note, unless_generator_lagged};
use crate::plan::{Ask, CpuPlan, Role};
use crate::progress::Progress;
use crate::stats::{median, repeat_flags, round_order};
use crate::verdict::{Measure, Spec, join_headline, measured_median, paired, positive};
use netlane_report::options::{OptionList, parse_positive_duration};
use netlane_report::{
    Axis, Chart, ChartKind, Column, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value,
};

/// How connections are placed on threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// netlane, workers dealt connections round robin (no alignment).
    Plain,
    /// netlane lanes, NAPI-id hand-off by the acceptor.
    Napi,
    /// netlane lanes, hand-off and per-epoll busy polling.
    NapiBusy,
    /// netlane lanes, the reuseport BPF selector.
    Reuseport,
    /// memcached 1.6.18.
    Memcached,
    /// memcached 1.6.18 with -N (NAPI ids) and the busy_poll sysctl.
    MemcachedN,
}

impl Mode {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }

    fn is_memcached(self) -> bool {
        matches!(self, Mode::Memcached | Mode::MemcachedN)
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
        default_value = "plain,napi,napi-busy,reuseport,memcached,memcached-n"
    )]
    pub modes: Vec<Mode>,
    /// Connection counts of the fixed-rate runs (the talk: 300..4400, scaled to two CPUs);
    /// the search uses the first.
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    pub connections: Vec<u32>,
    /// Offered rates of the fixed-rate runs, requests/s.
    #[arg(long, value_delimiter = ',', default_value = "10000,20000")]
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
    /// Busy polling of the napi-busy mode: USECS[,BUDGET[,prefer]].
    #[arg(long, default_value = "50,8")]
    pub busy_poll: BusyPoll,
    /// napi-busy: per-NAPI empty polls before interrupts are re-enabled (with
    /// --gro-flush-timeout, the lane's polling keeps the NAPI thread asleep).
    #[arg(long)]
    pub napi_defer_hard_irqs: Option<u32>,
    /// napi-busy: per-NAPI GRO flush / watchdog timeout.
    #[arg(long, value_parser = parse_positive_duration)]
    pub gro_flush_timeout: Option<Duration>,
    /// napi-busy: per-NAPI IRQ suspension timeout (Linux 6.13+; needs prefer in
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
}

fn parse_link_rate(s: &str) -> Result<u64, String> {
    netlane::metrics::units::parse_rate(s).map_err(|e| e.to_string())
}

/// Lanes, one receive queue each (and as many generator threads).
const LANES: usize = 2;

/// Where the lanes, their queues' NAPI threads and the generator's threads run: apart
/// where the machine has the CPUs; on two CPUs a lane, its NAPI thread and a generator
/// thread on each.
pub(super) fn cpu_plan() -> CpuPlan {
    plan_on(&CpuTopology::read())
}

/// The plan on a described machine (whose device has no NUMA node: a veth).
pub(super) fn plan_on(machine: &CpuTopology) -> CpuPlan {
    CpuPlan::new(
        machine,
        None,
        &[
            Ask::own(Role::Lane, LANES),
            Ask::or_beside(Role::Napi, LANES, Role::Lane),
            Ask::or_beside(Role::Generator, LANES, Role::Lane),
        ],
    )
}

/// One fixed-rate run.
#[derive(Debug, Clone, Serialize)]
pub struct LaneRun {
    /// Connections.
    pub connections: u32,
    /// Offered rate asked for.
    pub rate: u64,
    /// The generator's report.
    pub load: LoadReport,
    /// Busy CPU seconds over both CPUs.
    pub busy_s: f64,
    /// What the kernel counted meanwhile.
    pub kernel: KernelCounters,
    /// Runs made before this one and discarded: the generator lagged in them.
    pub discarded: u32,
}

/// One mode's round.
#[derive(Debug, Clone, Serialize)]
pub struct LaneRound {
    /// Which mode.
    pub mode: Mode,
    /// The search at the first connection count.
    pub search: Option<SearchReport>,
    /// The fixed-rate runs, connections-major.
    pub runs: Vec<LaneRun>,
    /// netlane's lanes at the end of the round.
    pub lanes: Option<LanesView>,
}

impl LanesBenchArgs {
    /// The defaults, as `netlane bench lanes` has them.
    pub fn defaults() -> LanesBenchArgs {
        super::from_words(&[]).expect("the defaults parse")
    }

    pub(super) fn load(&self, server: SocketAddr, connections: u32, pacing: Pacing, duration: Duration) -> LoadConfig {
        LoadConfig {
            server,
            connections,
            threads: LANES,
            cpus: Some(cpu_plan().cpus(Role::Generator).to_vec()),
            pacing,
            workload: self.workload.spec(1 << 20),
            duration,
            ramp: Duration::from_millis(200),
            max_in_flight: 64,
            late_after: Duration::from_micros(100),
            drain: Duration::from_millis(500),
            seed: 1,
        }
    }
}

pub(super) fn open(rate: f64) -> Pacing {
    Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: rate })
}

impl Scenario for LanesBenchArgs {
    fn name(&self) -> &'static str {
        "lanes"
    }

    fn options(&self) -> OptionList {
        let modes: Vec<String> = self.modes.iter().map(|m| m.name()).collect();
        let conns: Vec<u64> = self.connections.iter().map(|&c| u64::from(c)).collect();
        let list = OptionList::new().words("modes", &modes).ints("connections", &conns).ints("rates", &self.rates);
        let mut list = self
            .workload
            .echo(list)
            .text("sla", self.sla.to_string())
            .text("search-lo", self.search_lo.to_string())
            .text("search-hi", self.search_hi.to_string())
            .text("resolution", self.resolution.to_string())
            .duration("step", self.step)
            .text("busy-poll", self.busy_poll.to_string());
        // The per-NAPI knobs are echoed only when set (unset: the device's own).
        if let Some(v) = self.napi_defer_hard_irqs {
            list = list.int("napi-defer-hard-irqs", u64::from(v));
        }
        if let Some(d) = self.gro_flush_timeout {
            list = list.duration("gro-flush-timeout", d);
        }
        if let Some(d) = self.irq_suspend_timeout {
            list = list.duration("irq-suspend-timeout", d);
        }
        list.int("memcached-busy-poll", u64::from(self.memcached_busy_poll))
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .flag("no-search", self.no_search)
            .text("memcached", self.memcached.clone())
            .flag("no-isolation", self.no_isolation)
            .int("isolation-link", self.isolation_link)
            .int("isolation-rate", self.isolation_rate)
            .int("isolation-connections", u64::from(self.isolation_connections))
    }

    fn validate(&self) -> Result<()> {
        if self.modes.is_empty() {
            bail!("--modes: nothing to run");
        }
        if self.connections.is_empty() || self.connections.iter().any(|&c| !(2..=4096).contains(&c)) {
            bail!("--connections: at least one count, each 2..=4096");
        }
        if self.rates.is_empty() || self.rates.contains(&0) {
            bail!("--rates: at least one rate, none zero");
        }
        if !(self.search_lo > 0.0 && self.search_lo < self.search_hi && self.search_hi.is_finite()) {
            bail!("--search-lo {} / --search-hi {}: 0 < lo < hi", self.search_lo, self.search_hi);
        }
        if !(self.resolution > 1.0 && self.resolution.is_finite()) {
            bail!("--resolution {}: a ratio above 1", self.resolution);
        }
        let addr = SocketAddr::from(([10, 0, 0, 1], 11211));
        for &c in &self.connections {
            for &r in &self.rates {
                self.load(addr, c, open(r as f64), self.time).validate()?;
            }
        }
        if self.modes.iter().any(|m| m.is_memcached()) && !program_exists(&self.memcached) {
            bail!("{}: not found (scripts/setup.sh installs memcached)", self.memcached);
        }
        if !self.no_isolation {
            if self.isolation_link < 1_000_000 {
                bail!("--isolation-link {} B/s: at least 1 MB/s (8 Mbit/s)", self.isolation_link);
            }
            if !(2..=4096).contains(&self.isolation_connections) {
                bail!("--isolation-connections {}: 2..=4096", self.isolation_connections);
            }
            let addr = SocketAddr::from(([10, 0, 0, 1], 11211));
            self.load(addr, self.isolation_connections, open(self.isolation_rate as f64), self.time).validate()?;
            if !program_exists("socat") {
                bail!("socat: not found (scripts/setup.sh installs it; the isolation part's bulk sender)");
            }
        }
        if !netlane::topology::have_privileges() {
            bail!("the lanes scenario builds network namespaces and loads BPF: run it as root");
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        let per = 1 + usize::from(!self.no_search) + self.connections.len() * self.rates.len();
        let isolation = if self.no_isolation { 0 } else { 1 + 3 };
        (per * self.modes.len() + isolation) * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let plan = cpu_plan();
        let h =
            TwoHosts::create("lanes", LinkConfig { mtu: 1500, queues: LANES as u32, rx: RxTuning::threaded_napi() })?;
        // Requests take the server end's NAPI path (the generator's TSO off); replies
        // keep TSO and skip NAPI, their receive work done in the server's send (the
        // generator shares the CPUs: a NAPI thread of its own would cost it a wake-up
        // per reply).
        h.set_tx_tso(false)?;
        let placed_rx = netlane::topology::pin_napi_by_queue(&h.rx, h.rx_index, plan.cpus(Role::Napi))?;
        let addr = SocketAddr::new(IpAddr::V4(TwoHosts::RX_V4), 11211);
        let mut all: Vec<Vec<LaneRound>> = vec![Vec::new(); self.modes.len()];
        let mut records = Vec::new();
        let mut iso = Vec::new();
        for round in 0..self.repeat as usize {
            for i in round_order(self.modes.len(), round) {
                let mode = self.modes[i];
                let r = self
                    .round(&h, &plan, addr, mode, round, progress, &mut records)
                    .with_context(|| format!("{} round {}", mode.name(), round + 1))?;
                all[i].push(r);
            }
            if !self.no_isolation {
                iso.push(self.isolation_round(&h, round, progress, &mut records).context("isolation")?);
            }
        }
        drop(h);
        Ok(self.report(&all, &iso, &plan, &placed_rx, records))
    }
}

/// A server running in the rx namespace; stopped (or killed) on drop.
enum Running {
    Netlane(Option<Box<Server>>),
    /// memcached, and the busy_poll sysctl it runs with (restored when this drops).
    Memcached {
        child: Child,
        _busy_poll: Option<netlane::installed::Sysctl>,
    },
}

impl Drop for Running {
    fn drop(&mut self) {
        match self {
            Running::Netlane(s) => {
                if let Some(s) = s.take() {
                    s.stop();
                }
            }
            Running::Memcached { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl LanesBenchArgs {
    fn server_config(
        &self,
        h: &TwoHosts,
        lanes: &[usize],
        addr: SocketAddr,
        mode: Mode,
        max_conns: usize,
    ) -> ServerConfig {
        let base = ServerConfig {
            listen: addr,
            threads: lanes.len(),
            cpus: Some(lanes.to_vec()),
            store: StoreConfig::new(1 << 30, 1 << 20, 64),
            max_conns,
            ..ServerConfig::default()
        };
        match mode {
            Mode::Plain => ServerConfig { steer: Steer::RoundRobin, ..base },
            Mode::Napi | Mode::NapiBusy | Mode::Reuseport => ServerConfig {
                steer: if mode == Mode::Reuseport { Steer::Reuseport } else { Steer::Acceptor },
                lane_device: Some(h.rx_if.clone()),
                xps_rxqs: true,
                busy_poll: (mode == Mode::NapiBusy).then_some(self.busy_poll),
                napi: if mode == Mode::NapiBusy {
                    NapiSettings {
                        defer_hard_irqs: self.napi_defer_hard_irqs,
                        gro_flush_timeout_ns: self.gro_flush_timeout.map(|d| d.as_nanos() as u64),
                        irq_suspend_timeout_ns: self.irq_suspend_timeout.map(|d| d.as_nanos() as u64),
                    }
                } else {
                    NapiSettings::default()
                },
                ..base
            },
            Mode::Memcached | Mode::MemcachedN => unreachable!("memcached is not configured here"),
        }
    }

    fn start(&self, h: &TwoHosts, plan: &CpuPlan, addr: SocketAddr, mode: Mode) -> Result<Running> {
        let lanes = plan.cpus(Role::Lane);
        let max_conns = *self.connections.iter().max().unwrap_or(&64) as usize + 64;
        let running = if mode.is_memcached() {
            // `net.core.busy_poll` is global (the knob does not exist inside a namespace):
            // set for this run and put back as it was.
            let guard = (mode == Mode::MemcachedN)
                .then(|| {
                    netlane::installed::Sysctl::set(
                        "/proc/sys/net/core/busy_poll",
                        &self.memcached_busy_poll.to_string(),
                    )
                    .context("set net.core.busy_poll")
                })
                .transpose()?;
            let cpus = lanes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
            let mut cmd = memcached_command(h, &self.memcached, addr, &cpus, lanes.len(), max_conns as u32);
            if mode == Mode::MemcachedN {
                cmd.args(["-N", &lanes.len().to_string()]);
            }
            Running::Memcached {
                child: cmd.spawn().with_context(|| format!("start {}", self.memcached))?,
                _busy_poll: guard,
            }
        } else {
            let cfg = self.server_config(h, lanes, addr, mode, max_conns);
            let s = h.rx.run(move || Server::start(cfg))??;
            Running::Netlane(Some(Box::new(s)))
        };
        wait_until_accepting(h, addr, &mode.name())?;
        Ok(running)
    }

    /// Puts the per-NAPI knobs napi-busy changed back to the kernel's defaults, so that
    /// the modes after it run as they would alone.
    fn reset_napi(&self, h: &TwoHosts) -> Result<()> {
        if self.napi_defer_hard_irqs.is_none() && self.gro_flush_timeout.is_none() && self.irq_suspend_timeout.is_none()
        {
            return Ok(());
        }
        let (dev, ifindex) = (h.rx_if.clone(), h.rx_index);
        let here = h.rx.run(netlane::topology::NetnsHandle::current)??;
        let knobs = here.with_sysfs(move || -> Result<Vec<netlane::lanes::Knob>> {
            let ids = netlane::lanes::queues::discover(ifindex)?.napi_ids();
            let zero = NapiSettings {
                defer_hard_irqs: Some(0),
                gro_flush_timeout_ns: Some(0),
                irq_suspend_timeout_ns: Some(0),
            };
            // The kernel's defaults are meant to stay: nothing to put back.
            let applied = netlane::lanes::queues::apply_napi_settings(&dev, ifindex, &ids, &zero);
            applied.held.into_iter().for_each(netlane::installed::Held::release);
            Ok(applied.knobs)
        })??;
        for k in knobs.iter().filter(|k| !k.applied()) {
            tracing::warn!(knob = %k.name, status = ?k.status, "could not reset a per-NAPI knob");
        }
        Ok(())
    }

    /// One load run with the CPUs' busy time and the kernel's counters around it, made
    /// again when the generator lagged in it.
    fn measured(
        &self,
        h: &TwoHosts,
        rate: u64,
        cfg: LoadConfig,
        progress: &dyn Progress,
        label: &str,
    ) -> Result<LaneRun> {
        let connections = cfg.connections;
        let once = || -> Result<LaneRun> {
            let cfg = cfg.clone();
            let (cpu0, k0) = (SystemCpu::read().context("read /proc/stat")?, KernelCounters::read()?);
            let r = h.tx.run(move || loadgen::run(&cfg, &AtomicBool::new(false)))??;
            let (cpu1, k1) = (SystemCpu::read().context("read /proc/stat")?, KernelCounters::read()?);
            Ok(LaneRun {
                connections,
                rate,
                load: r.report,
                busy_s: cpu0.delta(&cpu1).busy_s,
                kernel: k0.delta(&k1),
                discarded: 0,
            })
        };
        let (mut run, discarded) = unless_generator_lagged(progress, label, once, |r| &r.load)?;
        run.discarded = discarded;
        Ok(run)
    }

    #[allow(clippy::too_many_arguments)]
    fn round(
        &self,
        h: &TwoHosts,
        plan: &CpuPlan,
        addr: SocketAddr,
        mode: Mode,
        round: usize,
        progress: &dyn Progress,
        records: &mut Vec<RunRecord>,
    ) -> Result<LaneRound> {
        let tag = |what: &str| {
            let mut l = format!("{} {what}", mode.name());
            if self.repeat > 1 {
                l.push_str(&format!(" #{}", round + 1));
            }
            l
        };
        let server = self.start(h, plan, addr, mode)?;
        let label = tag("warm-up");
        progress.start(&label);
        let warm = self.load(addr, 8, open(self.search_lo), self.step);
        let n = h.tx.run(move || loadgen::warm_up(&warm))??;
        progress.finish(&label, &format!("{n} keys stored"));
        let mut out = LaneRound { mode, search: None, runs: Vec::new(), lanes: None };
        if !self.no_search {
            let label = tag(&format!("search {}", self.sla));
            progress.start(&label);
            let cfg = self.load(addr, self.connections[0], open(self.search_lo), self.step);
            let range = SearchConfig {
                lo_per_s: self.search_lo,
                hi_per_s: self.search_hi,
                resolution: self.resolution,
                max_bisections: 10,
            };
            let sla = self.sla;
            let r = h.tx.run(move || loadgen::search(&cfg, sla, range, &AtomicBool::new(false), |_| {}))??;
            progress.finish(
                &label,
                &match r.best_per_s {
                    Some(b) => format!(
                        "{b:.0} requests/s{} ({} runs)",
                        if r.capped {
                            " (capped)"
                        } else if r.generator_limited {
                            " (the generator's limit)"
                        } else {
                            ""
                        },
                        r.runs
                    ),
                    None => format!("no rate held it ({} runs)", r.runs),
                },
            );
            let mut rec = RunRecord::new(
                records.len() as u32 + 1,
                round as u32 + 1,
                format!("{} search {}", mode.name(), self.sla),
                vec![("best_per_s", r.best_per_s)],
            );
            rec.detail = serde_json::to_value(&r).unwrap_or_default();
            records.push(rec);
            out.search = Some(r);
        }
        for &c in &self.connections {
            for &rate in &self.rates {
                let label = tag(&format!("{c} connections, {rate}/s"));
                progress.start(&label);
                let run = self.measured(h, rate, self.load(addr, c, open(rate as f64), self.time), progress, &label)?;
                progress.finish(&label, &summary(&run));
                let mut rec = RunRecord::new(
                    records.len() as u32 + 1,
                    round as u32 + 1,
                    format!("{} {c} connections {rate}/s", mode.name()),
                    vec![
                        ("achieved_per_s", Some(run.load.achieved_per_s)),
                        ("mean_us", run.load.mean_us),
                        ("p999_us", pct(&run.load, "p99.9")),
                        ("cpu_us_per_request", cpu_per_request(&run).ok()),
                    ],
                );
                rec.detail = serde_json::to_value(&run).unwrap_or_default();
                records.push(rec);
                out.runs.push(run);
            }
        }
        if let Running::Netlane(Some(s)) = &server {
            out.lanes = Some(s.lanes());
        }
        drop(server);
        if mode == Mode::NapiBusy {
            self.reset_napi(h)?;
        }
        Ok(out)
    }
}

fn pct(l: &LoadReport, p: &str) -> Option<f64> {
    l.latency_us.iter().find(|(k, _)| k == p).and_then(|(_, v)| *v)
}

/// A run that answered everything offered, sent on time: anything else cannot stand for
/// the server.
fn sound(r: &LaneRun) -> Result<(), String> {
    sound_load(&r.load)
}

/// [`sound`] for a bare load report.
pub(super) fn sound_load(l: &LoadReport) -> Result<(), String> {
    let c = &l.counts;
    if l.lag_share > netlane_kv::load::search::GENERATOR_LAG_MAX {
        return Err(format!("the generator delayed {:.1}% of its sends itself", l.lag_share * 100.0));
    }
    if c.completed == 0 {
        return Err("nothing was answered".into());
    }
    if c.errors + c.lost + c.unanswered + c.not_sent > 0 {
        return Err(format!(
            "{} errors, {} lost, {} unanswered, {} never sent of {} offered",
            c.errors, c.lost, c.unanswered, c.not_sent, c.offered
        ));
    }
    Ok(())
}

/// CPU µs per request over both CPUs, the generator's threads excluded (the NAPI work
/// of both ends and the server's remain).
fn cpu_per_request(r: &LaneRun) -> Measure {
    sound(r)?;
    let per = positive(r.load.counts.completed as f64, "completed requests")?;
    positive((r.busy_s - r.load.client_cpu_s) * 1e6 / per, "CPU per request")
}

fn per_request(r: &LaneRun, n: u64) -> Measure {
    sound(r)?;
    Ok(n as f64 / positive(r.load.counts.completed as f64, "completed requests")?)
}

fn latency(p: &'static str) -> impl Fn(&LaneRun) -> Measure {
    move |r| {
        sound(r)?;
        pct(&r.load, p).ok_or_else(|| format!("{p} fell among failed requests"))
    }
}

fn mean(r: &LaneRun) -> Measure {
    mean_of(&r.load)
}

/// The mean latency of a sound run.
pub(super) fn mean_of(l: &LoadReport) -> Measure {
    sound_load(l)?;
    l.mean_us.ok_or_else(|| "nothing completed".into())
}

/// A percentile of a sound run.
pub(super) fn latency_of(l: &LoadReport, p: &str) -> Measure {
    sound_load(l)?;
    pct(l, p).ok_or_else(|| format!("{p} fell among failed requests"))
}

fn summary(r: &LaneRun) -> String {
    let l = &r.load;
    let f = |p| pct(l, p).map_or("failed".to_string(), |v| format!("{v:.0} us"));
    format!(
        "{:.0}/s of {:.0}/s, mean {}, p99 {}, p99.9 {}, CPU {:.2} us/request, {:.2} context switches and {:.2} IPIs per request (lagged {:.1}%)",
        l.achieved_per_s,
        l.offered_per_s,
        l.mean_us.map_or("-".into(), |m| format!("{m:.0} us")),
        f("p99"),
        f("p99.9"),
        cpu_per_request(r).unwrap_or(f64::NAN),
        per_request(r, r.kernel.ctxt).unwrap_or(f64::NAN),
        per_request(r, r.kernel.ipis()).unwrap_or(f64::NAN),
        l.lag_share * 100.0
    )
}

/// The best rate of a round's search; invalid when none held, every one did, or the
/// generator's limit bounded it.
fn best(r: &LaneRound) -> Measure {
    let s = r.search.as_ref().ok_or("the search did not run")?;
    match s.best_per_s {
        None => Err(format!("{}: no rate held {}", r.mode.name(), s.sla)),
        Some(_) if s.capped => Err(format!("{}: every rate held {}: raise --search-hi", r.mode.name(), s.sla)),
        Some(_) if s.generator_limited => {
            Err(format!("{}: the search stopped where the generator could not keep its schedule", r.mode.name()))
        }
        Some(b) => positive(b, "best rate"),
    }
}

fn med<T>(rs: &[T], f: impl Fn(&T) -> Measure) -> Value {
    let v: Vec<f64> = rs.iter().filter_map(|r| f(r).ok()).collect();
    if v.is_empty() { Value::Missing } else { Value::num(median(v)) }
}

impl LanesBenchArgs {
    fn report(
        &self,
        all: &[Vec<LaneRound>],
        iso: &[Vec<IsoRun>],
        plan: &CpuPlan,
        placed: &[(u32, u32, usize)],
        runs: Vec<RunRecord>,
    ) -> ScenarioReport {
        let (mut tables, mut charts, mut checks, mut notes, mut flags) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let made_again = all.iter().flatten().flat_map(|r| r.runs.iter().map(|x| x.discarded)).sum::<u32>()
            + iso.iter().flatten().map(|r| r.discarded).sum::<u32>();
        notes.extend(discarded_note(made_again));
        let find = |m: Mode| self.modes.iter().position(|x| *x == m).map(|i| &all[i][..]);

        if !self.no_search {
            let mut t = Table::new(
                "lanes-sla",
                format!(
                    "Highest offered rate within {}, {} connections over two CPUs, medians of {} rounds",
                    self.sla, self.connections[0], self.repeat
                ),
                vec![
                    Column::new("mode", "mode", 0),
                    Column::new("sla_per_s", &format!("requests/s within {}", self.sla), 0),
                ],
            );
            let mut points = Vec::new();
            for (i, m) in self.modes.iter().enumerate() {
                t.push(Row::new(vec![Value::text(m.name()), med(&all[i], best)]));
                let v: Vec<f64> = all[i].iter().filter_map(|r| best(r).ok()).collect();
                flags.extend(repeat_flags(&format!("{} within {}", m.name(), self.sla), "requests/s", &v));
                points.extend(Point::of(i as f64, &v));
            }
            tables.push(t);
            charts.push(Chart {
                name: "lanes-sla".into(),
                title: format!("Requests/s within {} by placement", self.sla),
                kind: ChartKind::Bars,
                x: Axis::categories("mode", self.modes.iter().map(|m| m.name().to_string()).collect()),
                y: Axis::numeric("requests/s", Unit::Count("requests/s".into()), Scale::Linear),
                series: vec![Series { name: "requests/s".into(), points }],
            });
            let pairs: [(&str, String, f64, Mode, Mode); 3] = [
                (
                    "lanes.aligned-throughput",
                    format!("NAPI-id lanes hold more requests/s within {} than plain workers (talk: +70%)", self.sla),
                    1.7,
                    Mode::Napi,
                    Mode::Plain,
                ),
                (
                    "lanes.busy-poll-throughput",
                    format!("busy polling adds requests/s within {} to NAPI-id lanes", self.sla),
                    1.0,
                    Mode::NapiBusy,
                    Mode::Napi,
                ),
                (
                    "lanes.handoff-over-reuseport",
                    format!(
                        "the acceptor's NAPI-id hand-off holds more within {} than the no-change reuseport path (talk: 10-15%)",
                        self.sla
                    ),
                    1.1,
                    Mode::Napi,
                    Mode::Reuseport,
                ),
            ];
            for (id, name, target, a, b) in pairs {
                let spec = Spec::at_least(id, name, target, "x");
                // Busy-polling lanes spin on their CPUs: beside a generator's threads
                // they take its time, and the comparison would measure that.
                let spins = a == Mode::NapiBusy || b == Mode::NapiBusy;
                checks.push(match find(a).zip(find(b)) {
                    Some(_) if spins && !plan.apart(Role::Lane, Role::Generator) => spec.not_shown(
                        plan.needs(&[Role::Lane, Role::Generator]),
                        plan.available(),
                        "busy-polling lanes and the generator's threads apart",
                        &plan.describe(),
                    ),
                    Some((x, y)) => spec.evaluate(
                        paired(x, y, best),
                        &format!("{} / {} requests/s within {}, per round", a.name(), b.name(), self.sla),
                    ),
                    None => spec.skipped(format!("needs the {} and {} modes", a.name(), b.name())),
                });
            }
        }

        let mut t = Table::new(
            "lanes-rates",
            format!(
                "Fixed offered rates (Poisson) over two CPUs, medians of {} rounds; per request: over both CPUs",
                self.repeat
            ),
            vec![
                Column::new("mode", "mode, connections, offered", 0),
                Column::new("achieved_per_s", "achieved/s", 0),
                Column::new("mean_us", "mean us", 1),
                Column::new("p99_us", "p99 us", 1),
                Column::new("p999_us", "p99.9 us", 1),
                Column::new("cpu_us", "CPU us/request", 2),
                Column::new("ctxt", "context switches/request", 2),
                Column::new("irq", "interrupts/request", 2),
                Column::new("ipi", "IPIs/request", 2),
                Column::new("net_rx", "NET_RX softirqs/request", 2),
            ],
        );
        for (i, m) in self.modes.iter().enumerate() {
            for (j, (c, r)) in
                self.connections.iter().flat_map(|c| self.rates.iter().map(move |r| (*c, *r))).enumerate()
            {
                let rs: Vec<LaneRun> = all[i].iter().filter_map(|x| x.runs.get(j).cloned()).collect();
                t.push(Row::new(vec![
                    Value::text(format!("{} {c} {r}/s", m.name())),
                    med(&rs, |x| Ok(x.load.achieved_per_s)),
                    med(&rs, mean),
                    med(&rs, latency("p99")),
                    med(&rs, latency("p99.9")),
                    med(&rs, cpu_per_request),
                    med(&rs, |x| per_request(x, x.kernel.ctxt)),
                    med(&rs, |x| per_request(x, x.kernel.interrupts_total())),
                    med(&rs, |x| per_request(x, x.kernel.ipis())),
                    med(&rs, |x| per_request(x, x.kernel.softirq("NET_RX"))),
                ]));
            }
        }
        tables.push(t);
        // The tail at the highest load of the first connection count, aligned vs plain.
        let j = self.rates.len() - 1;
        fn p999(r: &LaneRun) -> Measure {
            latency("p99.9")(r)
        }
        type Of = fn(&LaneRun) -> Measure;
        let tails: [(&str, &str, f64, Of); 3] = [
            (
                "lanes.aligned-p999",
                "NAPI-id lanes' p99.9 against plain workers' at the highest fixed rate (talk: -60%)",
                0.4,
                p999,
            ),
            ("lanes.aligned-mean", "NAPI-id lanes' mean latency against plain workers' (talk: -60%)", 0.4, mean),
            (
                "lanes.aligned-cpu",
                "NAPI-id lanes spend less CPU per request than plain workers (no cross-CPU wake-ups)",
                0.9,
                cpu_per_request,
            ),
        ];
        for (id, name, target, f) in tails {
            let spec = Spec::at_most(id, name, target, "x");
            checks.push(match find(Mode::Napi).zip(find(Mode::Plain)) {
                Some((x, y)) => spec.evaluate(
                    paired(x, y, |r| r.runs.get(j).ok_or_else(|| "no run".to_string()).and_then(f)),
                    &format!("napi / plain at {} connections, {}/s, per round", self.connections[0], self.rates[j]),
                ),
                None => spec.skipped("needs the napi and plain modes"),
            });
        }

        // Where connections went, from the lanes' own counters (last round).
        let mut t = Table::new(
            "lanes-placement",
            "netlane's lanes: NAPI ids owned and connections placed (last round)".to_string(),
            vec![
                Column::new("lane", "mode, lane", 0),
                Column::new("cpu", "CPU", 0),
                Column::new("napi", "NAPI ids", 0),
                Column::new("by_owner", "by NAPI id owner", 0),
                Column::new("other", "by load or round robin", 0),
                Column::new("handed_over", "handed over", 0),
            ],
        );
        for (i, m) in self.modes.iter().enumerate() {
            let Some(v) = all[i].last().and_then(|r| r.lanes.as_ref()) else { continue };
            for l in &v.lanes {
                t.push(Row::new(vec![
                    Value::text(format!("{} lane {}", m.name(), l.lane)),
                    l.cpu.map_or(Value::Missing, |c| Value::num(c as f64)),
                    Value::text(l.napi_ids.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")),
                    Value::num(l.by_owner as f64),
                    Value::num((l.new_id + l.no_napi + l.round_robin) as f64),
                    Value::num(l.handed_over as f64),
                ]));
            }
            for k in v.knobs.iter().filter(|k| !k.applied) {
                notes.push(format!("{}: {} = {} was refused: {}", m.name(), k.name, k.wanted, k.detail));
            }
        }
        tables.push(t);
        if !iso.is_empty() {
            let (t, c, n) = super::isolation::report(self, iso);
            tables.push(t);
            checks.extend(c);
            notes.extend(n);
        }
        notes.push(format!("CPU plan: {}.", plan.describe()));
        if !plan.apart(Role::Lane, Role::Generator) {
            notes.push(
                "The generator shares the lanes' CPUs: a mode that keeps a CPU busy (busy polling) leaves it less, and \
                 a search that reaches a rate where the generator lags stops there (its checks are invalid, not \
                 missed). memcached -N polls through the global net.core.busy_poll, which makes every socket of the \
                 machine busy poll, the generator's too."
                    .to_string(),
            );
        }
        notes.push(format!(
            "The server's receive queues: {}. Each queue's threaded NAPI is pinned to the CPU the plan gives it; the \
             generator sends without TSO so that its TCP takes that NAPI path (veth gives TCP no NAPI id otherwise).",
            placed.iter().map(|(q, n, c)| format!("queue {q} = NAPI {n} on CPU {c}")).collect::<Vec<_>>().join(", ")
        ));

        let headline = {
            let get = |id: &str| measured_median(&checks, id);
            let parts = [
                get("lanes.aligned-throughput")
                    .map(|v| format!("NAPI-id lanes held {v}x plain workers' rate within {}", self.sla)),
                get("lanes.busy-poll-throughput").map(|v| format!("busy polling {v}x on top")),
                get("lanes.aligned-p999").map(|v| format!("{v}x their p99.9")),
                get("lanes.isolation-p999")
                    .map(|v| format!("per-application classes {v}x the cache's p99.9 beside a bulk neighbour")),
            ];
            join_headline(parts.into_iter().flatten().collect())
                .unwrap_or_else(|| format!("{} modes, {} rounds.", self.modes.len(), self.repeat))
        };
        let options = self.options();
        ScenarioReport {
            name: "lanes".into(),
            title:
                "Lanes: connections on the thread that owns their receive queue, against plain workers and memcached"
                    .into(),
            description: format!(
                "netlane's cache server in one namespace with {LANES} workers (lanes), netlane's open-loop generator in \
                 another with {LANES} threads, joined by a veth with a queue per lane, each queue's NAPI thread pinned; \
                 the CPU plan places them (apart where the machine has the CPUs). Modes: {}. \
                 Busy polling of napi-busy: {}; memcached -N runs with net.core.busy_poll={} us. The key space ({} keys) is \
                 stored before each mode's round. A rate of the search is decided by three runs of {} of five, or two that agree far from the bound.",
                self.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "),
                self.busy_poll,
                self.memcached_busy_poll,
                self.workload.keys,
                netlane_report::format::seconds(self.step.as_secs_f64())
            ),
            headline,
            options: options.object(),
            echo: options.echo(),
            tables,
            charts,
            checks,
            flags,
            notes,
            runs,
            cpu_plan: plan.view(),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use netlane_kv::loadgen::CountsView;
    use netlane_report::Outcome;

    pub(in crate::scenarios) fn load(rate: f64, p999_us: f64, lag: f64) -> LoadReport {
        let n = (rate * 3.0) as u64;
        LoadReport {
            mode: "open",
            target_per_s: Some(rate),
            seconds: 3.0,
            offered_per_s: rate,
            achieved_per_s: rate,
            counts: CountsView {
                offered: n,
                sent: n,
                sent_late: 0,
                sent_lagged: (n as f64 * lag) as u64,
                completed: n,
                hits: n,
                misses: 0,
                stored: 0,
                errors: 0,
                lost: 0,
                unanswered: 0,
                not_sent: 0,
            },
            mean_us: Some(p999_us / 20.0),
            latency_us: ["p50", "p90", "p99", "p99.9", "p99.99"]
                .iter()
                .map(|p| (p.to_string(), Some(if *p == "p99.9" { p999_us } else { p999_us / 10.0 })))
                .collect(),
            late_share: lag,
            lag_share: lag,
            connection_failures: 0,
            client_cpu_s: 1.0,
            client_cpu_busy: 0.5,
        }
    }

    fn round(mode: Mode, best: Option<f64>, p999_us: f64, lag: f64) -> LaneRound {
        LaneRound {
            mode,
            search: Some(SearchReport {
                sla: "p99=500us".into(),
                best_per_s: best,
                capped: false,
                generator_limited: false,
                curve: Vec::new(),
                runs: 4,
            }),
            runs: vec![LaneRun {
                connections: 64,
                rate: 20_000,
                load: load(20_000.0, p999_us, lag),
                busy_s: 2.0,
                kernel: KernelCounters::default(),
                discarded: 0,
            }],
            lanes: None,
        }
    }

    fn two_cpus() -> CpuPlan {
        plan_on(&CpuTopology::uniform(1, 2, 1))
    }

    fn args() -> LanesBenchArgs {
        let mut a = LanesBenchArgs::defaults();
        a.modes = vec![Mode::Plain, Mode::Napi];
        a.connections = vec![64];
        a.rates = vec![20_000];
        a.repeat = 2;
        a
    }

    fn outcome(r: &ScenarioReport, id: &str) -> Outcome {
        r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}")).outcome
    }

    #[test]
    fn paired_rounds_decide_the_alignment_targets() {
        let plain = vec![round(Mode::Plain, Some(50_000.0), 3000.0, 0.0); 2];
        let napi = vec![round(Mode::Napi, Some(90_000.0), 1000.0, 0.0); 2];
        let r = args().report(&[plain.clone(), napi], &[], &two_cpus(), &[], Vec::new());
        assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Met);
        assert_eq!(outcome(&r, "lanes.aligned-p999"), Outcome::Met);
        assert_eq!(outcome(&r, "lanes.busy-poll-throughput"), Outcome::Skipped);
        let napi = vec![round(Mode::Napi, Some(55_000.0), 2900.0, 0.0); 2];
        let r = args().report(&[plain, napi], &[], &two_cpus(), &[], Vec::new());
        assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Missed);
        assert_eq!(outcome(&r, "lanes.aligned-p999"), Outcome::Missed);
    }

    #[test]
    fn degenerate_rounds_are_invalid_never_met() {
        // No rate held, or the generator lagged: nothing is proven about the server.
        let plain = vec![round(Mode::Plain, None, 3000.0, 0.0); 2];
        let napi = vec![round(Mode::Napi, Some(90_000.0), 1000.0, 0.2); 2];
        let r = args().report(&[plain, napi], &[], &two_cpus(), &[], Vec::new());
        assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Invalid);
        assert_eq!(outcome(&r, "lanes.aligned-p999"), Outcome::Invalid);
        let mut limited = round(Mode::Napi, Some(90_000.0), 1000.0, 0.0);
        limited.search.as_mut().unwrap().generator_limited = true;
        let plain = vec![round(Mode::Plain, Some(50_000.0), 3000.0, 0.0); 2];
        let r = args().report(&[plain, vec![limited.clone(), limited]], &[], &two_cpus(), &[], Vec::new());
        assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Invalid);
    }

    #[test]
    fn busy_polling_beside_the_generator_is_not_shown_on_two_cpus() {
        let mut a = args();
        a.modes = vec![Mode::Napi, Mode::NapiBusy];
        let rounds = [
            vec![round(Mode::Napi, Some(50_000.0), 1000.0, 0.0); 2],
            vec![round(Mode::NapiBusy, Some(60_000.0), 900.0, 0.0); 2],
        ];
        let r = a.report(&rounds, &[], &two_cpus(), &[], Vec::new());
        assert_eq!(outcome(&r, "lanes.busy-poll-throughput"), Outcome::NotShown);
        let c = r.checks.iter().find(|c| c.id == "lanes.busy-poll-throughput").unwrap();
        assert!(
            c.reason.starts_with("needs 4 CPUs") && c.reason.contains("generator on CPU 0,1 (beside lane)"),
            "{}",
            c.reason
        );
        assert_eq!(r.cpu_plan.len(), 3);
        // On eight CPUs the roles are apart and the check is decided.
        let r = a.report(&rounds, &[], &plan_on(&CpuTopology::uniform(1, 8, 1)), &[], Vec::new());
        assert_eq!(outcome(&r, "lanes.busy-poll-throughput"), Outcome::Met);
        assert!(r.cpu_plan.iter().all(|p| p.beside.is_none()), "{:?}", r.cpu_plan);
    }

    #[test]
    fn the_plan_keeps_lanes_napi_threads_and_generators_apart_where_the_cpus_allow() {
        // 2 CPUs: a lane, its NAPI thread and a generator thread on each (as before the
        // plan); 8 and 64 (with SMT and two nodes): every role on CPUs of its own.
        let p = plan_on(&CpuTopology::uniform(1, 2, 1));
        assert_eq!(
            (p.cpus(Role::Lane), p.cpus(Role::Napi), p.cpus(Role::Generator)),
            (&[0, 1][..], &[0, 1][..], &[0, 1][..])
        );
        for m in [CpuTopology::uniform(1, 8, 1), CpuTopology::uniform(2, 16, 2)] {
            let p = plan_on(&m);
            assert!(
                p.apart(Role::Lane, Role::Napi)
                    && p.apart(Role::Lane, Role::Generator)
                    && p.apart(Role::Napi, Role::Generator),
                "{} CPUs: {}",
                m.len(),
                p.describe()
            );
        }
    }

    #[test]
    fn defaults_parse_and_count_their_runs() {
        let d = LanesBenchArgs::defaults();
        assert_eq!(d.modes.len(), 6);
        // Per round: warm-up, search and four fixed rates per mode; the isolation part's
        // warm-up and three cases.
        assert_eq!(d.runs(), ((1 + 1 + 4) * 6 + 1 + 3) * 3);
        assert_eq!(d.busy_poll.to_string(), "50,8");
    }
}
