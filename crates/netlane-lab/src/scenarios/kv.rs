//! `kv`: the memcached-protocol cache against memcached 1.6.18 under one open-loop load
//! generator (the ADQ talk's application, measured its way: throughput under a tail
//! latency SLA). The server in one namespace on its own CPU, the generator in another
//! on the other CPU, joined by a veth pair.
//!
//! - sla: the highest offered rate each server holds within the SLA (p99.9 < 1 ms by
//!   default) and within a tighter one, found by bisection over short open-loop runs,
//!   the best rate confirmed by a second run;
//! - rates: latency percentiles and the server CPU per request at fixed offered rates;
//! - closed: a closed loop (one request in flight per connection, the way memtier-style
//!   tools measure) against an open loop at 80% of the rate the closed loop reached (a
//!   closed loop runs the generator flat out): what coordinated omission hides.
//!
//! Every round starts each server fresh, loads the key space, and runs its parts; the
//! servers alternate first from round to round. Ratios pair the servers within a round.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use netlane::metrics::cpu::SystemCpu;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_kv::load::schedule::{Arrivals, Pacing, Process};
use netlane_kv::load::search::{GENERATOR_LAG_MAX, SearchConfig};
use netlane_kv::load::stats::Sla;
use netlane_kv::load::workload::{KeyDist, SizeDist, WorkloadSpec};
use netlane_kv::loadgen::{self, LoadConfig, LoadReport, SearchReport};
use netlane_kv::server::{Server, ServerConfig};
use netlane_kv::store::StoreConfig;
use serde::Serialize;

use super::{Scenario, discarded_note, unless_generator_lagged};
use crate::engines::stalls::{self, Stalls};
use crate::progress::Progress;
use crate::stats::{median, repeat_flags};
use crate::verdict::{Measure, Spec, join_headline, measured_median, paired, positive};
use netlane_report::options::{OptionList, parse_duration, parse_positive_duration};
use netlane_report::{
    Axis, Chart, ChartKind, Column, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value,
};

/// A part of the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Part {
    /// Highest rate within the SLA and within a tighter one.
    Sla,
    /// Latency and server CPU at fixed offered rates.
    Rates,
    /// Closed loop against open loop at most of the closed loop's rate.
    Closed,
}

impl Part {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// A server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum ServerKind {
    /// `netlane kv serve`'s server.
    Netlane,
    /// memcached (Debian's 1.6.18).
    Memcached,
}

impl ServerKind {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

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
            .text("get-ratio", self.get_ratio.to_string())
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
    /// Offered rates of the rates part, requests/s.
    #[arg(long, value_delimiter = ',', default_value = "20000,50000,80000")]
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
    /// CPU of the server and its end's NAPI.
    #[arg(long, default_value_t = 1)]
    pub server_cpu: usize,
    /// CPU of the load generator and its end's NAPI.
    #[arg(long, default_value_t = 0)]
    pub client_cpu: usize,
    /// The memcached binary.
    #[arg(long, default_value = "memcached")]
    pub memcached: String,
}

/// One fixed-rate (or closed-loop) run: what the generator measured and the server
/// CPU's busy time over it.
#[derive(Debug, Clone, Serialize)]
pub struct KvRun {
    /// The generator's report.
    pub load: LoadReport,
    /// Server CPU busy seconds over the run.
    pub server_busy_s: f64,
    /// Server CPU wall seconds over the run.
    pub server_total_s: f64,
    /// Runs made before this one and discarded: the generator lagged in them.
    pub discarded: u32,
}

/// One server's round.
#[derive(Debug, Clone, Serialize)]
pub struct KvRound {
    /// Which server.
    pub server: String,
    /// The SLA searches: the main one, then the tight one.
    pub searches: Vec<SearchReport>,
    /// The fixed rates, in --rates order.
    pub rates: Vec<KvRun>,
    /// Closed loop, then open loop at [`OPEN_SHARE`] of the closed loop's rate.
    pub closed: Option<(KvRun, KvRun)>,
    /// The floor: a run at the lowest search rate, and the stalls cyclictest saw on the
    /// server CPU during it.
    pub floor: Option<(KvRun, Stalls)>,
}

impl KvBenchArgs {
    /// The defaults, as `netlane bench kv` has them.
    pub fn defaults() -> KvBenchArgs {
        super::from_words(&[]).expect("the defaults parse")
    }

    fn workload(&self) -> WorkloadSpec {
        self.workload.spec(1 << 20)
    }

    fn load(&self, server: SocketAddr, pacing: Pacing, duration: Duration) -> LoadConfig {
        LoadConfig {
            server,
            connections: self.connections,
            threads: 1,
            cpus: Some(vec![self.client_cpu]),
            pacing,
            workload: self.workload(),
            duration,
            ramp: Duration::from_millis(200),
            max_in_flight: 64,
            late_after: Duration::from_micros(100),
            drain: Duration::from_millis(500),
            seed: 1,
        }
    }
}

fn open(rate: f64) -> Pacing {
    Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: rate })
}

impl Scenario for KvBenchArgs {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn options(&self) -> OptionList {
        let parts: Vec<String> = self.parts.iter().map(|p| p.name()).collect();
        let servers: Vec<String> = self.servers.iter().map(|s| s.name()).collect();
        let list = OptionList::new()
            .words("parts", &parts)
            .words("servers", &servers)
            .int("connections", u64::from(self.connections))
            .int("threads", self.threads as u64);
        self.workload
            .echo(list)
            .text("sla", self.sla.to_string())
            .text("tight-sla", self.tight_sla.to_string())
            .text("search-lo", self.search_lo.to_string())
            .text("search-hi", self.search_hi.to_string())
            .text("resolution", self.resolution.to_string())
            .duration("step", self.step)
            .ints("rates", &self.rates)
            .int("closed-depth", u64::from(self.closed_depth))
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .duration("stall-probe", self.stall_probe)
            .int("server-cpu", self.server_cpu as u64)
            .int("client-cpu", self.client_cpu as u64)
            .text("memcached", self.memcached.clone())
    }

    fn validate(&self) -> Result<()> {
        let n = netlane::cpus::online_count();
        for (what, c) in [("--server-cpu", self.server_cpu), ("--client-cpu", self.client_cpu)] {
            if c >= n {
                bail!("{what} {c}: this machine has CPUs 0-{}", n - 1);
            }
        }
        if self.parts.is_empty() || self.servers.is_empty() {
            bail!("--parts and --servers: nothing to run");
        }
        if !(1..=64).contains(&self.threads) {
            bail!("--threads {}: 1..=64", self.threads);
        }
        if self.parts.contains(&Part::Rates) && (self.rates.is_empty() || self.rates.contains(&0)) {
            bail!("--rates: at least one rate, none zero");
        }
        if !(self.search_lo > 0.0 && self.search_lo < self.search_hi && self.search_hi.is_finite()) {
            bail!("--search-lo {} / --search-hi {}: 0 < lo < hi", self.search_lo, self.search_hi);
        }
        if !(self.resolution > 1.0 && self.resolution.is_finite()) {
            bail!("--resolution {}: a ratio above 1", self.resolution);
        }
        let addr = SocketAddr::from(([10, 0, 0, 1], 11211));
        let check = [
            self.load(addr, open(self.search_lo), self.step),
            self.load(addr, Pacing::Closed { depth: self.closed_depth }, self.time),
        ];
        for c in check {
            c.validate()?;
        }
        for r in &self.rates {
            self.load(addr, open(*r as f64), self.time).validate()?;
        }
        if self.stall_probe > Duration::from_secs(600) {
            bail!("--stall-probe {:?}: at most 600s", self.stall_probe);
        }
        if self.probes_stalls() && !program_exists("cyclictest") {
            bail!("cyclictest: not found (scripts/setup.sh installs rt-tests; --stall-probe 0s skips the probe)");
        }
        if self.servers.contains(&ServerKind::Memcached) && !program_exists(&self.memcached) {
            bail!("{}: not found (scripts/setup.sh --lab installs memcached)", self.memcached);
        }
        if !netlane::topology::have_privileges() {
            bail!("the kv scenario builds two network namespaces: run it as root");
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        let per = |p: &Part| match p {
            Part::Sla => 2,
            Part::Rates => self.rates.len(),
            Part::Closed => 2,
        };
        let per_server = 1 + usize::from(self.probes_stalls()) + self.parts.iter().map(per).sum::<usize>();
        per_server * self.servers.len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let h = TwoHosts::create(
            "kv",
            LinkConfig { mtu: 1500, queues: 1, rx: RxTuning::threaded_napi_on(self.server_cpu) },
        )?;
        RxTuning::threaded_napi_on(self.client_cpu).apply(&h.tx, &h.tx_if, h.tx_index)?;
        // TCP over veth skips NAPI while TSO is on (drivers/net/veth.c): a packet's
        // receive work runs in its sender's context, on the sender's CPU, right after the
        // send. The server CPU therefore carries the receive side of its replies, and the
        // generator's CPU that of the requests, for both servers alike. Measured against
        // the alternatives (each end's threaded NAPI or RPS on its own CPU): both cost an
        // inter-processor wake-up per packet, and the generator then fell behind at
        // 80,000/s (15% of sends delayed) where this way it keeps its schedule past
        // 130,000/s.
        let addr = SocketAddr::new(IpAddr::V4(TwoHosts::RX_V4), 11211);
        let mut all: Vec<Vec<KvRound>> = vec![Vec::new(); self.servers.len()];
        let mut records = Vec::new();
        for round in 0..self.repeat as usize {
            for k in 0..self.servers.len() {
                let i = (k + round) % self.servers.len();
                let kind = self.servers[i];
                let r = self
                    .round(&h, addr, kind, round, progress, &mut records)
                    .with_context(|| format!("{} round {}", kind.name(), round + 1))?;
                all[i].push(r);
            }
        }
        drop(h);
        Ok(self.report(&all, records))
    }
}

impl KvBenchArgs {
    /// `e` (why a round has no ratio) with what the floor run of the server whose
    /// search found no rate saw.
    fn with_floor(&self, e: String, a: &KvRound, b: &KvRound, i: usize, sla: Sla) -> String {
        let floor = [a, b]
            .into_iter()
            .find(|r| best(r, i).is_err())
            .and_then(|r| r.floor.as_ref().map(|f| (r.server.as_str(), f)));
        let Some((server, (run, f))) = floor else { return e };
        let p = format!("p{}", sla.quantile() * 100.0);
        format!(
            "{e} ({server} at {:.0}/s: {p} {}; meanwhile cyclictest saw {} stalls of the server CPU >= 1 ms, the longest \
             {} us, alone delaying {:.3}% of requests past {})",
            self.search_lo,
            pct(run, &p).map_or("beyond every answer".into(), |v| format!("{v:.0} us")),
            f.over_1ms,
            f.max_us,
            f.delayed_share(sla_bound_us(sla)) * 100.0,
            sla_bound_text(sla)
        )
    }

    /// What the floor runs say of each SLA: whether either server held it at the
    /// lowest rate, and how much of its budget the stalls cyclictest saw took.
    fn floor_notes(&self, all: &[Vec<KvRound>]) -> Vec<String> {
        let mut out = Vec::new();
        for sla in [self.sla, self.tight_sla] {
            let p = format!("p{}", sla.quantile() * 100.0);
            let bound_us = sla.latency_ns() as f64 / 1e3;
            let mut per_server = Vec::new();
            let mut held = 0;
            let mut runs = 0;
            for (i, kind) in self.servers.iter().enumerate() {
                let v: Vec<f64> =
                    all[i].iter().filter_map(|r| r.floor.as_ref()).filter_map(|(run, _)| pct(run, &p)).collect();
                held += v.iter().filter(|&&x| x <= bound_us).count();
                runs += v.len();
                if !v.is_empty() {
                    per_server.push(format!("{} {:.0} us", kind.name(), median(v)));
                }
            }
            let shares: Vec<f64> = all
                .iter()
                .flatten()
                .filter_map(|r| r.floor.as_ref())
                .map(|(_, f)| f.delayed_share(sla_bound_us(sla)))
                .collect();
            if shares.is_empty() {
                continue;
            }
            let allowed = (1.0 - sla.quantile()) * 100.0;
            out.push(format!(
                "{sla}: at {:.0}/s, a few percent of either server's capacity, {p} was {} (medians of rounds); {held} of \
                 {runs} such runs held {}. During them cyclictest (SCHED_FIFO 99) saw the server CPU stall for 1 ms or \
                 more now and then; those stalls alone delay {:.3}% of requests past {} (median; the SLA allows \
                 {allowed:.2}%), a lower bound: requests also wait when the other CPU, or the whole virtual machine, \
                 stalls. {}",
                self.search_lo,
                per_server.join(", "),
                sla_bound_text(sla),
                median(shares) * 100.0,
                sla_bound_text(sla),
                if held * 2 < runs {
                    "Below the floor of this machine: a search that finds no rate measured the machine, not the server."
                } else {
                    "Within the floor of this machine."
                }
            ));
        }
        out
    }

    fn probes_stalls(&self) -> bool {
        self.parts.contains(&Part::Sla) && !self.stall_probe.is_zero()
    }

    fn floor_table(&self, all: &[Vec<KvRound>]) -> Table {
        let share = |sla: Sla| format!("requests the stalls alone delay past {}, %", sla_bound_text(sla));
        let mut t = Table::new(
            "kv-floor",
            format!(
                "The floor: each server at {:.0}/s for {} with cyclictest (SCHED_FIFO 99, a wake-up every 1 ms) on the \
                 server CPU meanwhile, measuring how late a ready thread ran",
                self.search_lo,
                netlane_report::format::seconds(self.stall_probe.as_secs_f64())
            ),
            vec![
                Column::new("mode", "server, round", 0),
                Column::new("p999_us", "requests' p99.9 us", 0),
                Column::new("p99_us", "requests' p99 us", 0),
                Column::new("over_1ms", "stalls >= 1 ms", 0),
                Column::new("max_us", "longest stall us", 0),
                Column::new("sla_share", &share(self.sla), 3),
                Column::new("tight_share", &share(self.tight_sla), 3),
            ],
        );
        for (i, kind) in self.servers.iter().enumerate() {
            for (k, r) in all[i].iter().enumerate() {
                let Some((run, f)) = &r.floor else { continue };
                t.push(Row::new(vec![
                    Value::text(format!("{} #{}", kind.name(), k + 1)),
                    latency("p99.9")(run).map_or(Value::Missing, Value::num),
                    latency("p99")(run).map_or(Value::Missing, Value::num),
                    Value::num(f.over_1ms as f64),
                    Value::num(f.max_us as f64),
                    Value::num(f.delayed_share(sla_bound_us(self.sla)) * 100.0),
                    Value::num(f.delayed_share(sla_bound_us(self.tight_sla)) * 100.0),
                ]));
            }
        }
        t
    }
}

pub(crate) fn program_exists(p: &str) -> bool {
    if p.contains('/') {
        return std::path::Path::new(p).is_file();
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
}

/// A server running in the rx namespace; stopped (or killed) on drop.
enum Running {
    Netlane(Option<Box<Server>>),
    Memcached(Child),
}

impl Drop for Running {
    fn drop(&mut self) {
        match self {
            Running::Netlane(s) => {
                if let Some(s) = s.take() {
                    s.stop();
                }
            }
            Running::Memcached(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// memcached in the server's namespace on `cpus` (a CPU list for taskset), serving
/// `addr` over TCP only with `threads` threads, 1 GiB and `max_conns` connections,
/// killed when the thread that spawns it ends. Its output is discarded: a server that
/// cannot start shows as one that never accepts.
pub(super) fn memcached_command(
    h: &TwoHosts,
    program: &str,
    addr: SocketAddr,
    cpus: &str,
    threads: usize,
    max_conns: u32,
) -> std::process::Command {
    let mut cmd = h.rx.command("taskset");
    cmd.args(["-c", cpus, program])
        .args(["-l", &addr.ip().to_string(), "-p", &addr.port().to_string(), "-U", "0"])
        .args(["-t", &threads.to_string(), "-m", "1024", "-c", &max_conns.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if nix::unistd::geteuid().is_root() {
        cmd.args(["-u", "root"]);
    }
    // A lab run that is killed takes memcached with it (the spawning thread is the
    // scenario's, which outlives the server).
    netlane_sys::process::kill_with_parent(&mut cmd);
    cmd
}

/// Waits (10 s at most) until a server accepts connections on `addr` from the
/// generator's side; `what` names it in the error.
pub(super) fn wait_until_accepting(h: &TwoHosts, addr: SocketAddr, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if h.tx.run(move || TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what} did not accept connections on {addr} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl KvBenchArgs {
    fn start(&self, h: &TwoHosts, addr: SocketAddr, kind: ServerKind) -> Result<Running> {
        let running = match kind {
            ServerKind::Netlane => {
                let cfg = ServerConfig {
                    listen: addr,
                    threads: self.threads,
                    store: StoreConfig::new(1 << 30, 1 << 20, 64),
                    max_conns: self.connections as usize + 64,
                    cpus: Some(vec![self.server_cpu]),
                    ..ServerConfig::default()
                };
                let cpu = self.server_cpu;
                // Started from a thread pinned to the server CPU: the acceptor inherits it.
                let s = h.rx.run(move || {
                    netlane::cpus::pin(Some(cpu));
                    Server::start(cfg)
                })??;
                Running::Netlane(Some(Box::new(s)))
            }
            ServerKind::Memcached => {
                let cpus = self.server_cpu.to_string();
                let mut cmd = memcached_command(h, &self.memcached, addr, &cpus, self.threads, self.connections + 64);
                Running::Memcached(cmd.spawn().with_context(|| format!("start {}", self.memcached))?)
            }
        };
        wait_until_accepting(h, addr, &kind.name())?;
        Ok(running)
    }

    /// One load run with the server CPU's busy time around it.
    fn measured_once(&self, h: &TwoHosts, cfg: LoadConfig) -> Result<KvRun> {
        let cpu0 = SystemCpu::read_cpu(self.server_cpu).context("read /proc/stat")?;
        let r = h.tx.run(move || loadgen::run(&cfg, &AtomicBool::new(false)))??;
        let cpu1 = SystemCpu::read_cpu(self.server_cpu).context("read /proc/stat")?;
        let d = cpu0.delta(&cpu1);
        Ok(KvRun { load: r.report, server_busy_s: d.busy_s, server_total_s: d.total_s, discarded: 0 })
    }

    /// [`Self::measured_once`], made again when the generator lagged in it.
    fn measured(&self, h: &TwoHosts, cfg: LoadConfig, progress: &dyn Progress, label: &str) -> Result<KvRun> {
        let (mut run, discarded) =
            unless_generator_lagged(progress, label, || self.measured_once(h, cfg.clone()), |r| &r.load)?;
        run.discarded = discarded;
        Ok(run)
    }

    fn round(
        &self,
        h: &TwoHosts,
        addr: SocketAddr,
        kind: ServerKind,
        round: usize,
        progress: &dyn Progress,
        records: &mut Vec<RunRecord>,
    ) -> Result<KvRound> {
        let tag = |what: &str| {
            let mut l = format!("{} {what}", kind.name());
            if self.repeat > 1 {
                l.push_str(&format!(" #{}", round + 1));
            }
            l
        };
        let _server = self.start(h, addr, kind)?;
        let label = tag("warm-up");
        progress.start(&label);
        let warm = self.load(addr, open(self.search_lo), self.step);
        let n = h.tx.run(move || loadgen::warm_up(&warm))??;
        progress.finish(&label, &format!("{n} keys stored"));
        let mut out =
            KvRound { server: kind.name(), searches: Vec::new(), rates: Vec::new(), closed: None, floor: None };
        let index = |records: &Vec<RunRecord>| records.len() as u32 + 1;
        if self.probes_stalls() {
            let label = tag(&format!("floor at {:.0}/s with cyclictest", self.search_lo));
            progress.start(&label);
            let (cpu, dur) = (self.server_cpu, self.stall_probe);
            let (run, st) = std::thread::scope(|sc| {
                let probe = sc.spawn(move || stalls::probe(cpu, dur, Duration::from_millis(1)));
                let run = self.measured_once(h, self.load(addr, open(self.search_lo), dur));
                (run, probe.join().unwrap_or_else(|_| Err(stalls::StallError::Output("the probe panicked".into()))))
            });
            let (run, st) = (run?, st?);
            progress.finish(
                &label,
                &format!(
                    "{}; cyclictest: {} stalls >= 1 ms (max {} us), alone delaying {:.3}% of requests past 1 ms",
                    summary(&run),
                    st.over_1ms,
                    st.max_us,
                    st.delayed_share(1000) * 100.0
                ),
            );
            records.push(record(
                index(records),
                round,
                &format!("{} floor at {:.0}/s", kind.name(), self.search_lo),
                &run,
            ));
            out.floor = Some((run, st));
        }
        if self.parts.contains(&Part::Sla) {
            for sla in [self.sla, self.tight_sla] {
                let label = tag(&format!("search {sla}"));
                progress.start(&label);
                let cfg = self.load(addr, open(self.search_lo), self.step);
                let range = SearchConfig {
                    lo_per_s: self.search_lo,
                    hi_per_s: self.search_hi,
                    resolution: self.resolution,
                    max_bisections: 12,
                };
                let r = h.tx.run(move || loadgen::search(&cfg, sla, range, &AtomicBool::new(false), |_| {}))??;
                progress.finish(
                    &label,
                    &match r.best_per_s {
                        Some(b) => format!(
                            "{b:.0} requests/s{} ({} rates, {} runs)",
                            if r.capped { " (capped)" } else { "" },
                            r.curve.len(),
                            r.runs
                        ),
                        None => format!("no rate held it ({} rates, {} runs)", r.curve.len(), r.runs),
                    },
                );
                let mut rec = RunRecord::new(
                    index(records),
                    round as u32 + 1,
                    format!("{} search {sla}", kind.name()),
                    vec![("best_per_s", r.best_per_s), ("runs", Some(r.runs as f64))],
                );
                rec.detail = serde_json::to_value(&r).unwrap_or_default();
                records.push(rec);
                out.searches.push(r);
            }
        }
        if self.parts.contains(&Part::Rates) {
            for rate in &self.rates {
                let label = tag(&format!("{rate}/s"));
                progress.start(&label);
                let r = self.measured(h, self.load(addr, open(*rate as f64), self.time), progress, &label)?;
                progress.finish(&label, &summary(&r));
                records.push(record(index(records), round, &format!("{} {rate}/s", kind.name()), &r));
                out.rates.push(r);
            }
        }
        if self.parts.contains(&Part::Closed) {
            let label = tag("closed loop");
            progress.start(&label);
            let closed = self.measured(
                h,
                self.load(addr, Pacing::Closed { depth: self.closed_depth }, self.time),
                progress,
                &label,
            )?;
            progress.finish(&label, &summary(&closed));
            records.push(record(index(records), round, &format!("{} closed loop", kind.name()), &closed));
            // A closed loop runs the generator flat out; the open loop is offered a share
            // of that rate so that the generator keeps its schedule.
            let rate = closed.load.achieved_per_s * OPEN_SHARE;
            if rate <= 0.0 {
                bail!("{}: the closed loop completed nothing", kind.name());
            }
            let label = tag("open loop at 80% of the closed loop's rate");
            progress.start(&label);
            let opened = self.measured(h, self.load(addr, open(rate), self.time), progress, &label)?;
            progress.finish(&label, &summary(&opened));
            records.push(record(index(records), round, &format!("{} open loop at {rate:.0}/s", kind.name()), &opened));
            out.closed = Some((closed, opened));
        }
        Ok(out)
    }
}

fn pct(r: &KvRun, p: &str) -> Option<f64> {
    r.load.latency_us.iter().find(|(k, _)| k == p).and_then(|(_, v)| *v)
}

fn summary(r: &KvRun) -> String {
    let l = &r.load;
    let f = |p| pct(r, p).map_or("failed".to_string(), |v| format!("{v:.0} us"));
    format!(
        "{:.0}/s achieved of {:.0}/s, p99 {}, p99.9 {}, server CPU {:.2} us/request, generator CPU {:.0}% (lagged {:.1}%)",
        l.achieved_per_s,
        l.offered_per_s,
        f("p99"),
        f("p99.9"),
        cpu_per_request(r).unwrap_or(f64::NAN),
        l.client_cpu_busy * 100.0,
        l.lag_share * 100.0
    )
}

fn record(index: u32, round: usize, label: &str, r: &KvRun) -> RunRecord {
    let mut rec = RunRecord::new(
        index,
        round as u32 + 1,
        label,
        vec![
            ("offered_per_s", Some(r.load.offered_per_s)),
            ("achieved_per_s", Some(r.load.achieved_per_s)),
            ("p50_us", pct(r, "p50")),
            ("p99_us", pct(r, "p99")),
            ("p999_us", pct(r, "p99.9")),
            ("server_cpu_us_per_request", cpu_per_request(r).ok()),
            ("generator_cpu_busy_pct", Some(r.load.client_cpu_busy * 100.0)),
        ],
    );
    rec.detail = serde_json::to_value(r).unwrap_or_default();
    rec
}

/// The open loop of the closed part is offered this share of the closed loop's rate.
const OPEN_SHARE: f64 = 0.8;

/// A run that answered what was offered: all of it, without errors, sent when it
/// could go (a send the generator itself delayed, not one waiting for the server, is a
/// lagged one: beyond [`GENERATOR_LAG_MAX`] of them the generator measured itself).
/// Anything else cannot stand for the server's cost or latency.
fn sound(r: &KvRun) -> Result<(), String> {
    let c = &r.load.counts;
    // A closed loop has no schedule to keep: its sends wait for answers by design.
    if r.load.mode == "open" && r.load.lag_share > GENERATOR_LAG_MAX {
        return Err(format!(
            "the generator delayed {:.1}% of its sends itself (its CPU {:.0}% busy): it measured itself",
            r.load.lag_share * 100.0,
            r.load.client_cpu_busy * 100.0
        ));
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

/// Server CPU microseconds per completed request.
fn cpu_per_request(r: &KvRun) -> Measure {
    sound(r)?;
    let per_s = positive(r.load.achieved_per_s, "completed requests per second")?;
    if r.server_total_s <= 0.0 {
        return Err("no CPU time was counted".into());
    }
    positive(r.server_busy_s / r.server_total_s * 1e6 / per_s, "server CPU per request")
}

fn latency(p: &'static str) -> impl Fn(&KvRun) -> Measure {
    move |r: &KvRun| {
        sound(r)?;
        pct(r, p).ok_or_else(|| format!("{p} fell among failed requests"))
    }
}

/// The best rate of search `i`; invalid when no rate held the SLA, or every rate did
/// (the capacity lies above the range). A rate the generator's limit bounded is
/// returned: it is a lower bound of the server's ([`sla_ratio`] decides what it proves).
fn best(r: &KvRound, i: usize) -> Measure {
    let s = r.searches.get(i).ok_or("the search did not run")?;
    match s.best_per_s {
        None => Err(format!("{}: no rate held {}", r.server, s.sla)),
        Some(_) if s.capped => Err(format!("{}: every rate held {}: raise --search-hi", r.server, s.sla)),
        Some(b) => positive(b, "best rate"),
    }
}

/// netlane's best rate over memcached's in one round, for a target of at least
/// `target`. A side whose search stopped at the generator's limit gave a lower bound:
/// netlane's still proves a ratio at or above the target (the true one is higher), and
/// anything else is undecided.
fn sla_ratio(n: &KvRound, m: &KvRound, i: usize, target: f64) -> Measure {
    let r = crate::verdict::ratio(best(n, i), best(m, i))?;
    let limited = |x: &KvRound| x.searches.get(i).is_some_and(|s| s.generator_limited);
    match (limited(n), limited(m)) {
        (false, false) => Ok(r),
        (true, false) if r >= target => Ok(r),
        (true, false) => Err(format!(
            "netlane's search stopped where the generator could not keep its schedule, at {r:.2}x memcached's rate: \
             give the generator more CPU"
        )),
        (_, true) => Err("memcached's search stopped where the generator could not keep its schedule".into()),
    }
}

/// The ratio the SLA checks ask of netlane over memcached (Pelikan reported +40%).
const SLA_TARGET: f64 = 1.3;

fn sla_bound_us(sla: Sla) -> u64 {
    sla.latency_ns() / 1000
}

fn sla_bound_text(sla: Sla) -> String {
    netlane_report::format::seconds(sla.latency_ns() as f64 / 1e9)
}

/// One round's closed loop and the open loop at its rate.
struct LoopPair {
    server: String,
    rate: f64,
    closed_p50: f64,
    open_p50: f64,
    closed_p999: f64,
    open_p999: f64,
}

fn med<T>(rs: &[T], f: impl Fn(&T) -> Measure) -> Value {
    let v: Vec<f64> = rs.iter().filter_map(|r| f(r).ok()).collect();
    if v.is_empty() { Value::Missing } else { Value::num(median(v)) }
}

impl KvBenchArgs {
    fn report(&self, all: &[Vec<KvRound>], runs: Vec<RunRecord>) -> ScenarioReport {
        let (mut tables, mut charts, mut checks, mut notes, mut flags) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let made_again = all
            .iter()
            .flatten()
            .flat_map(|r| r.rates.iter().chain(r.closed.iter().flat_map(|(c, o)| [c, o])))
            .map(|r| r.discarded)
            .sum();
        notes.extend(discarded_note(made_again));
        let find = |k: ServerKind| self.servers.iter().position(|s| *s == k).map(|i| &all[i][..]);
        let pair = find(ServerKind::Netlane).zip(find(ServerKind::Memcached));

        if self.parts.contains(&Part::Sla) {
            let mut t = Table::new(
                "kv-sla",
                format!(
                    "Highest offered rate within the SLA, {} connections, Poisson arrivals, medians of {} rounds",
                    self.connections, self.repeat
                ),
                vec![
                    Column::new("server", "server", 0),
                    Column::new("sla_per_s", &format!("requests/s within {}", self.sla), 0),
                    Column::new("tight_per_s", &format!("requests/s within {}", self.tight_sla), 0),
                    Column::new("floor_us", &format!("{} at {:.0}/s, us", self.sla, self.search_lo), 0),
                    Column::new("runs", "search runs", 0),
                ],
            );
            let mut chart_series = Vec::new();
            for (i, kind) in self.servers.iter().enumerate() {
                let rs = &all[i];
                t.push(Row::new(vec![
                    Value::text(kind.name()),
                    med(rs, |r| best(r, 0)),
                    med(rs, |r| best(r, 1)),
                    // The search's first run, at the lowest rate: the machine's floor.
                    med(rs, |r| {
                        r.searches
                            .first()
                            .and_then(|s| s.curve.first())
                            .and_then(|p| p.sla_latency_us)
                            .ok_or_else(|| "no latency at the lowest rate".to_string())
                    }),
                    med(rs, |r| Ok(r.searches.iter().map(|s| s.runs).sum::<usize>() as f64)),
                ]));
                flags.extend(repeat_flags(
                    &format!("{} within {}", kind.name(), self.sla),
                    "requests/s",
                    &rs.iter().filter_map(|r| best(r, 0).ok()).collect::<Vec<_>>(),
                ));
                // The search curve of the first round: latency at the SLA percentile by rate.
                if let Some(s) = rs.first().and_then(|r| r.searches.first()) {
                    let mut pts: Vec<(f64, f64)> =
                        s.curve.iter().filter_map(|p| p.sla_latency_us.map(|u| (p.offered_per_s, u / 1e6))).collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    chart_series.push(Series {
                        name: kind.name(),
                        points: pts.into_iter().filter_map(|(x, y)| Point::of(x, &[y])).collect(),
                    });
                }
            }
            tables.push(t);
            charts.push(Chart {
                name: "kv-sla".into(),
                title: format!(
                    "Latency at the SLA's percentile ({}) by offered rate: the first round's search",
                    self.sla
                ),
                kind: ChartKind::Lines,
                x: Axis::numeric("offered requests/s", Unit::Count("requests/s".into()), Scale::Linear),
                y: Axis::numeric("latency", Unit::Seconds, Scale::Log),
                series: chart_series,
            });
            for (i, sla, id) in [(0, self.sla, "kv.sla-throughput"), (1, self.tight_sla, "kv.tight-sla-throughput")] {
                let spec = Spec::at_least(
                    id,
                    format!("netlane's server holds at least 1.3x memcached's rate within {sla} (Pelikan: +40%)"),
                    SLA_TARGET,
                    "x",
                );
                checks.push(match pair {
                    Some((n, m)) => {
                        // A round's ratio, or why there is none; when a search found no
                        // rate, what its server's floor run saw of the machine.
                        let samples = n
                            .iter()
                            .zip(m)
                            .map(|(a, b)| sla_ratio(a, b, i, SLA_TARGET).map_err(|e| self.with_floor(e, a, b, i, sla)))
                            .collect();
                        spec.evaluate(samples, &format!("netlane / memcached highest rate within {sla}, per round"))
                    }
                    None => spec.skipped("needs both servers"),
                });
            }
            if all.iter().flatten().any(|r| r.floor.is_some()) {
                tables.push(self.floor_table(all));
                notes.extend(self.floor_notes(all));
            }
        }

        if self.parts.contains(&Part::Rates) {
            let mut t = Table::new(
                "kv-rates",
                format!(
                    "Fixed offered rates (Poisson), {} connections, medians of {} rounds",
                    self.connections, self.repeat
                ),
                vec![
                    Column::new("mode", "server, offered", 0),
                    Column::new("achieved_per_s", "achieved/s", 0),
                    Column::new("p50_us", "p50 us", 1),
                    Column::new("p99_us", "p99 us", 1),
                    Column::new("p999_us", "p99.9 us", 1),
                    Column::new("p9999_us", "p99.99 us", 1),
                    Column::new("server_cpu_us_per_request", "server CPU us/request", 2),
                    Column::new("generator_cpu_pct", "generator CPU %", 0),
                    Column::new("late_pct", "late sends %", 2),
                    Column::new("lag_pct", "generator lag %", 2),
                ],
            );
            let mut series = Vec::new();
            for (i, kind) in self.servers.iter().enumerate() {
                let mut pts = Vec::new();
                for (j, rate) in self.rates.iter().enumerate() {
                    let rs: Vec<&KvRun> = all[i].iter().filter_map(|r| r.rates.get(j)).collect();
                    let rs: Vec<KvRun> = rs.into_iter().cloned().collect();
                    t.push(Row::new(vec![
                        Value::text(format!("{} {rate}/s", kind.name())),
                        med(&rs, |r| Ok(r.load.achieved_per_s)),
                        med(&rs, latency("p50")),
                        med(&rs, latency("p99")),
                        med(&rs, latency("p99.9")),
                        med(&rs, latency("p99.99")),
                        med(&rs, cpu_per_request),
                        med(&rs, |r| Ok(r.load.client_cpu_busy * 100.0)),
                        med(&rs, |r| Ok(r.load.late_share * 100.0)),
                        med(&rs, |r| Ok(r.load.lag_share * 100.0)),
                    ]));
                    let v: Vec<f64> = rs.iter().filter_map(|r| latency("p99.9")(r).ok().map(|u| u / 1e6)).collect();
                    pts.extend(Point::of(*rate as f64, &v));
                }
                series.push(Series { name: kind.name(), points: pts });
            }
            tables.push(t);
            charts.push(Chart {
                name: "kv-rates".into(),
                title: "p99.9 latency by offered rate".into(),
                kind: ChartKind::Lines,
                x: Axis::numeric("offered requests/s", Unit::Count("requests/s".into()), Scale::Linear),
                y: Axis::numeric("p99.9 latency", Unit::Seconds, Scale::Log),
                series,
            });
            if let Some((n, m)) = pair {
                // The highest rate both servers answered soundly in every round.
                let j = (0..self.rates.len())
                    .rev()
                    .find(|&j| n.iter().chain(m).all(|r| r.rates.get(j).is_some_and(|x| cpu_per_request(x).is_ok())));
                let spec = Spec::at_most(
                    "kv.cpu-per-request",
                    "netlane's server spends no more CPU per request than memcached",
                    1.0,
                    "x",
                );
                checks.push(match j {
                    Some(j) => spec.evaluate(
                        paired(n, m, |r| r.rates.get(j).ok_or("no run".to_string()).and_then(cpu_per_request)),
                        &format!("netlane / memcached server CPU per request at {}/s, per round", self.rates[j]),
                    ),
                    None => spec.invalid("no offered rate was answered soundly by both servers in every round"),
                });
            }
        }

        if self.parts.contains(&Part::Closed) {
            let mut t = Table::new(
                "kv-closed",
                format!(
                    "Closed loop ({} in flight per connection, {} connections) against open loop at 80% of the rate it reached: \
                     coordinated omission",
                    self.closed_depth, self.connections
                ),
                vec![
                    Column::new("mode", "server, loop", 0),
                    Column::new("achieved_per_s", "achieved/s", 0),
                    Column::new("p50_us", "p50 us", 1),
                    Column::new("p99_us", "p99 us", 1),
                    Column::new("p999_us", "p99.9 us", 1),
                    Column::new("p9999_us", "p99.99 us", 1),
                ],
            );
            let mut seen = Vec::new();
            for (i, kind) in self.servers.iter().enumerate() {
                for (which, pick) in [("closed", 0usize), ("open, 80% of its rate", 1)] {
                    let rs: Vec<KvRun> = all[i]
                        .iter()
                        .filter_map(|r| r.closed.as_ref().map(|c| if pick == 0 { c.0.clone() } else { c.1.clone() }))
                        .collect();
                    t.push(Row::new(vec![
                        Value::text(format!("{} {which}", kind.name())),
                        med(&rs, |r| Ok(r.load.achieved_per_s)),
                        med(&rs, latency("p50")),
                        med(&rs, latency("p99")),
                        med(&rs, latency("p99.9")),
                        med(&rs, latency("p99.99")),
                    ]));
                }
                for r in &all[i] {
                    if let Some((c, o)) = &r.closed
                        && let (Ok(cp50), Ok(op50), Ok(c999), Ok(o999)) =
                            (latency("p50")(c), latency("p50")(o), latency("p99.9")(c), latency("p99.9")(o))
                    {
                        seen.push(LoopPair {
                            server: kind.name(),
                            rate: c.load.achieved_per_s,
                            closed_p50: cp50,
                            open_p50: op50,
                            closed_p999: c999,
                            open_p999: o999,
                        });
                    }
                }
            }
            tables.push(t);
            let in_flight = f64::from(self.connections) * f64::from(self.closed_depth);
            for kind in &self.servers {
                let v: Vec<&LoopPair> = seen.iter().filter(|s| s.server == kind.name()).collect();
                if v.is_empty() {
                    continue;
                }
                let m = |f: fn(&LoopPair) -> f64| median(v.iter().map(|s| f(s)).collect());
                notes.push(format!(
                    "{}: the closed loop kept {in_flight:.0} requests in flight and reached {:.0}/s, so its p50 of {:.0} us \
                     is mostly its own queue (Little: {in_flight:.0} / {:.0}/s = {:.0} us); requests arriving on their own \
                     at 80% of that rate (open loop) waited {:.0} us at p50 and {:.0} us at p99.9, against the closed \
                     loop's {:.0} us (medians of rounds). A closed loop reports the latency of the load it generates \
                     itself, and slows its sending while the server stalls, so a stall is counted once per connection \
                     instead of once per request that would have arrived meanwhile.",
                    kind.name(),
                    m(|s| s.rate),
                    m(|s| s.closed_p50),
                    m(|s| s.rate),
                    in_flight / m(|s| s.rate) * 1e6,
                    m(|s| s.open_p50),
                    m(|s| s.open_p999),
                    m(|s| s.closed_p999),
                ));
            }
        }

        let headline = {
            let get = |id: &str| measured_median(&checks, id);
            let parts = [
                get("kv.sla-throughput")
                    .map(|v| format!("netlane's server held {v}x memcached's rate within {}", self.sla)),
                get("kv.tight-sla-throughput").map(|v| format!("{v}x within {}", self.tight_sla)),
                get("kv.cpu-per-request").map(|v| format!("{v}x its CPU per request")),
            ];
            join_headline(parts.into_iter().flatten().collect())
                .unwrap_or_else(|| format!("{} servers, {} rounds.", self.servers.len(), self.repeat))
        };
        let options = self.options();
        ScenarioReport {
            name: "kv".into(),
            title: "Memcached-protocol cache: throughput within a tail-latency SLA, against memcached 1.6.18".into(),
            description: format!(
                "Each server ({} worker thread(s), pinned to CPU {}) in one network namespace, netlane's open-loop load generator (one thread on CPU {}, {} connections, Poisson arrivals \
                 from a precomputed schedule, latency from the scheduled send time) in another, joined by a veth pair. \
                 The key space ({} keys, key sizes {} B, value sizes {} B) is stored before each round; {:.0}% gets. The search \
                 finds the highest offered rate whose percentile holds the SLA (bisection over {} runs, each rate \
                 decided by three runs of five, or by two that agree far from the bound; the best decided again); a run that fell behind (under 90% of the offered rate completed) misses, \
                 and one in which the generator delayed more than 5% of its sends itself measured the generator (the search then says \
                 that it stopped at the generator's limit). \
                 memcached runs with the same thread count and memory, without -N (no busy polling for either). \
                 TCP over veth takes no NAPI path while TSO is on: each packet's receive work runs on its sender's CPU, \
                 so a server CPU figure includes the receive side of its replies and excludes that of its requests, \
                 the same for both servers.",
                self.threads,
                self.server_cpu,
                self.client_cpu,
                self.connections,
                self.workload.keys,
                self.workload.key_size,
                self.workload.value_size,
                self.workload.get_ratio * 100.0,
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
            cpu_plan: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use netlane_kv::loadgen::CountsView;
    use netlane_report::Outcome;

    fn run(rate: f64, p999_us: f64, busy_s: f64, late: f64) -> KvRun {
        let n = (rate * 3.0) as u64;
        KvRun {
            load: LoadReport {
                mode: "open",
                target_per_s: Some(rate),
                seconds: 3.0,
                offered_per_s: rate,
                achieved_per_s: rate,
                counts: CountsView {
                    offered: n,
                    sent: n,
                    sent_late: (n as f64 * late) as u64,
                    sent_lagged: (n as f64 * late) as u64,
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
                late_share: late,
                lag_share: late,
                connection_failures: 0,
                client_cpu_s: 1.0,
                client_cpu_busy: 0.5,
            },
            server_busy_s: busy_s,
            server_total_s: 3.0,
            discarded: 0,
        }
    }

    fn search(best: Option<f64>, capped: bool) -> SearchReport {
        SearchReport {
            sla: "p99.9=1ms".into(),
            best_per_s: best,
            capped,
            generator_limited: false,
            curve: Vec::new(),
            runs: 4,
        }
    }

    fn round(server: ServerKind, best: Option<f64>, busy_s: f64, late: f64) -> KvRound {
        KvRound {
            server: server.name(),
            searches: vec![search(best, false), search(best, false)],
            rates: vec![run(20_000.0, 900.0, busy_s, late)],
            closed: None,
            floor: None,
        }
    }

    fn args() -> KvBenchArgs {
        let mut a = KvBenchArgs::defaults();
        a.parts = vec![Part::Sla, Part::Rates];
        a.rates = vec![20_000];
        a.repeat = 2;
        a
    }

    fn outcome(r: &ScenarioReport, id: &str) -> Outcome {
        r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}")).outcome
    }

    #[test]
    fn defaults_validate_their_options_without_root_checks() {
        let d = KvBenchArgs::defaults();
        assert_eq!(d.sla.to_string(), "p99.9=1ms");
        assert!(d.runs() > 0);
    }

    #[test]
    fn paired_rounds_decide_the_targets() {
        let n = vec![round(ServerKind::Netlane, Some(140_000.0), 1.0, 0.0); 2];
        let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
        let r = args().report(&[n, m], Vec::new());
        assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Met);
        assert_eq!(outcome(&r, "kv.cpu-per-request"), Outcome::Met);
        let n = vec![round(ServerKind::Netlane, Some(110_000.0), 1.3, 0.0); 2];
        let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
        let r = args().report(&[n, m], Vec::new());
        assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Missed);
        assert_eq!(outcome(&r, "kv.cpu-per-request"), Outcome::Missed);
    }

    #[test]
    fn degenerate_runs_are_invalid_never_met() {
        // No rate held the SLA, or every rate did: no capacity was found.
        let n = vec![round(ServerKind::Netlane, None, 1.0, 0.0); 2];
        let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
        assert_eq!(outcome(&args().report(&[n, m], Vec::new()), "kv.sla-throughput"), Outcome::Invalid);
        let mut capped = round(ServerKind::Netlane, Some(300_000.0), 1.0, 0.0);
        capped.searches[0].capped = true;
        let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
        assert_eq!(
            outcome(&args().report(&[vec![capped.clone(), capped], m], Vec::new()), "kv.sla-throughput"),
            Outcome::Invalid
        );
        // A generator that sent 10% late measured itself: no CPU comparison from it.
        let n = vec![round(ServerKind::Netlane, Some(140_000.0), 1.0, 0.10); 2];
        let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
        assert_eq!(outcome(&args().report(&[n, m], Vec::new()), "kv.cpu-per-request"), Outcome::Invalid);
    }

    #[test]
    fn a_rate_the_generator_bounded_proves_only_a_ratio_over_the_target() {
        let limited = |best: f64| {
            let mut r = round(ServerKind::Netlane, Some(best), 1.0, 0.0);
            for s in &mut r.searches {
                s.generator_limited = true;
            }
            r
        };
        let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
        // 1.4x with netlane held back by the generator: at least 1.4x, met.
        let r = args().report(&[vec![limited(140_000.0); 2], m.clone()], Vec::new());
        assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Met);
        // 1.1x so held back: the true ratio may be anything above, so undecided.
        let r = args().report(&[vec![limited(110_000.0); 2], m.clone()], Vec::new());
        assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Invalid);
        // memcached held back: its rate is a lower bound, so no ratio is proven.
        let mut mm = round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0);
        mm.searches[0].generator_limited = true;
        let n = vec![round(ServerKind::Netlane, Some(200_000.0), 1.0, 0.0); 2];
        let r = args().report(&[n, vec![mm.clone(), mm]], Vec::new());
        assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Invalid);
    }

    #[test]
    fn a_search_that_found_no_rate_shows_its_servers_floor() {
        let stalls = |long_us: Vec<u64>| Stalls {
            cpu: 1,
            seconds: 10.0,
            samples: 10_000,
            max_us: long_us.first().copied().unwrap_or(20),
            p999_us: 30,
            over_1ms: long_us.iter().filter(|&&l| l >= 1000).count() as u64,
            long_us,
        };
        // Three 40 ms stalls in 10 s delay 1.17% of requests past 1 ms.
        let noisy = stalls(vec![40_000; 3]);
        assert!((noisy.delayed_share(1000) - 0.0117).abs() < 1e-9);
        let mut n = round(ServerKind::Netlane, None, 1.0, 0.0);
        n.floor = Some((run(10_000.0, 2500.0, 1.0, 0.0), noisy.clone()));
        let mut m = round(ServerKind::Memcached, None, 1.2, 0.0);
        m.floor = Some((run(10_000.0, 3500.0, 1.2, 0.0), noisy));
        let r = args().report(&[vec![n.clone(), n], vec![m.clone(), m]], Vec::new());
        let c = r.checks.iter().find(|c| c.id == "kv.sla-throughput").unwrap();
        assert_eq!(c.outcome, Outcome::Invalid);
        assert!(c.reason.contains("netlane at 10000/s: p99.9 2500 us"), "{}", c.reason);
        assert!(c.reason.contains("alone delaying 1.170% of requests past 1 ms"), "{}", c.reason);
        assert!(r.tables.iter().any(|t| t.name == "kv-floor"));
        assert!(
            r.notes.iter().any(|n| n.contains("0 of 4 such runs held 1 ms") && n.contains("Below the floor")),
            "{:?}",
            r.notes
        );
    }
}
