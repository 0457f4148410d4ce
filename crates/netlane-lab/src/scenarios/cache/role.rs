//! The cache scenarios' roles as processes: netlane's cache server, `netlane kv serve`
//! for a [`ServerConfig`], its lanes read back from its final report; and the load
//! generator, `netlane kv load` for a [`LoadConfig`], asked to store the key space, to
//! make one run, or to search for the highest rate within an SLA, what it did read back
//! from its JSON.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane_kv::load::schedule::Pacing;
use netlane_kv::load::search::SearchConfig;
use netlane_kv::load::stats::Sla;
use netlane_kv::loadgen::{AgentOutput, LoadConfig, LoadReport, SearchReport};
use netlane_kv::server::{LanesView, ServerConfig};
use serde::Deserialize;

use crate::host::{Args, Finished, Host, RoleProcess, RoleSpec};

/// The arguments after `netlane` that serve `cfg` over TCP, writing the final counters
/// as JSON on stdout: every option a `ServerConfig` sets that the scenarios use,
/// written out (the command line's tests read them back into the same configuration).
/// The server is TCP only unless `cfg` asks for UDP; a Unix socket is not written.
pub fn kv_serve_args(cfg: &ServerConfig) -> Vec<String> {
    // memcached's ports: 0 is off, -1 a free port.
    let port = |p: Option<u16>| match p {
        None => "0".to_string(),
        Some(0) => "-1".to_string(),
        Some(p) => p.to_string(),
    };
    let (st, napi) = (&cfg.store, &cfg.napi);
    let mut a = Args::new(&["kv", "serve", "--json", "-"]);
    a.opt("listen", cfg.listen.ip())
        .opt("port", port(cfg.tcp.then_some(cfg.listen.port())))
        .opt("udp-port", port(cfg.udp_port))
        .opt("threads", cfg.threads)
        .opt("memory-limit", format!("{}b", st.memory))
        .opt("max-item-size", format!("{}b", st.item_max))
        .opt("shards", st.shards)
        .flag("disable-cas", !st.cas)
        .flag("disable-evictions", !st.evictions)
        .opt("conn-limit", cfg.max_conns)
        .opt("listen-backlog", cfg.backlog)
        .opt("steer", cfg.steer)
        .opt_some("busy-poll", cfg.busy_poll)
        .opt_some("lane-device", cfg.lane_device.as_ref())
        .napi(napi)
        .opt_some("max-lanes", cfg.max_lanes)
        .flag("xps-rxqs", cfg.xps_rxqs);
    if let Some(cpus) = &cfg.cpus {
        a.opt("cpus", cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
    }
    if let Some(t) = cfg.idle_timeout {
        a.duration("idle-timeout", t);
    }
    a.into_vec()
}

/// `netlane kv serve` for `cfg`, on `cpus` (its workers' CPUs), ready when it says it
/// listens.
pub(crate) fn kv_serve_spec(cfg: &ServerConfig, cpus: &[usize]) -> RoleSpec {
    RoleSpec::netlane("netlane kv serve", kv_serve_args(cfg))
        .on_cpus(cpus)
        .ready_on_stderr("listening on", Duration::from_secs(10))
}

/// What netlane's cache server's lanes did, from the report it wrote when it stopped.
pub(crate) fn kv_serve_lanes(f: &Finished) -> Result<LanesView> {
    #[derive(Deserialize)]
    struct KvServe {
        stats: Stats,
    }
    #[derive(Deserialize)]
    struct Stats {
        lanes: LanesView,
    }
    Ok(f.json::<KvServe>().context("read the cache server's final counters")?.stats.lanes)
}

/// What a `netlane kv load` process is asked to do.
#[derive(Debug, Clone, Copy)]
pub enum LoadStep {
    /// Store every key, then exit.
    WarmUp,
    /// One run.
    Run,
    /// One run as an agent of a coordinated run: connect, say `ready`, start on SIGUSR1,
    /// write the whole histogram.
    Agent,
    /// The highest rate within `sla`, in `range`.
    Search {
        /// The objective.
        sla: Sla,
        /// The rates tried and how finely.
        range: SearchConfig,
    },
}

/// The arguments after `netlane` that do `step` with `cfg`: every option the command line
/// has, written out, so the process does exactly that whatever the defaults become (the
/// command line's tests read them back into the same configuration). Threads take the
/// CPUs in ascending order.
pub fn load_args(cfg: &LoadConfig, step: LoadStep) -> Vec<String> {
    let mut a = Args::new(&["kv", "load", "--json", "-"]);
    let w = &cfg.workload;
    a.opt("server", cfg.server).opt("connections", cfg.connections).opt("threads", cfg.threads);
    if let Some(cpus) = &cfg.cpus {
        a.opt("cpus", cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
    }
    match cfg.pacing {
        Pacing::Open(arrivals) => a.opt("rate", arrivals.rate_per_s).opt("arrival", arrivals.process),
        Pacing::Closed { depth } => a.opt("closed", depth),
    };
    a.opt("keys", w.keys)
        .opt("key-dist", w.key_dist)
        .opt("key-size", w.key_size)
        .opt("value-size", w.value_size)
        .opt("get-ratio", w.get_ratio)
        .opt("multiget", w.multiget)
        .opt("item-max", w.item_max)
        .duration("duration", cfg.duration)
        .duration("ramp", cfg.ramp)
        .duration("drain", cfg.drain)
        .opt("max-in-flight", cfg.max_in_flight)
        .duration("late-after", cfg.late_after)
        .opt("seed", cfg.seed);
    match step {
        LoadStep::WarmUp => a.flag("warmup-only", true),
        LoadStep::Run => a.flag("no-warmup", true),
        LoadStep::Agent => a.flag("no-warmup", true).flag("agent", true),
        LoadStep::Search { sla, range } => a
            .flag("no-warmup", true)
            .flag("search", true)
            .opt("sla", sla)
            .opt("search-lo", range.lo_per_s)
            .opt("search-hi", range.hi_per_s)
            .opt("resolution", range.resolution)
            .opt("max-bisections", range.max_bisections),
    };
    a.into_vec()
}

/// What `netlane kv load` wrote: the part the lab reads.
#[derive(Deserialize)]
pub(crate) struct KvLoad {
    pub(crate) report: Option<LoadReport>,
    pub(crate) search: Option<SearchReport>,
    pub(crate) warmed_up_keys: Option<u64>,
    pub(crate) agent: Option<AgentOutput>,
}

/// `netlane kv load` doing `step` with `cfg`, pinned to the configuration's CPUs.
pub(crate) fn load_spec(name: &str, cfg: &LoadConfig, step: LoadStep) -> RoleSpec {
    let spec = RoleSpec::netlane(name, load_args(cfg, step));
    match &cfg.cpus {
        Some(cpus) => spec.on_cpus(cpus),
        None => spec,
    }
}

/// Runs `netlane kv load` doing `step` with `cfg` on `host`, and reads back what it
/// wrote (a run's report also when the run failed: the report says what went wrong, and
/// the scenario judges it).
pub(crate) fn load_on(host: &dyn Host, cfg: &LoadConfig, step: LoadStep) -> Result<KvLoad> {
    let spec = load_spec("netlane kv load", cfg, step);
    let finished = RoleProcess::start(host, &spec, None)?.wait(time_limit(cfg, step))?;
    match finished.json::<KvLoad>() {
        Ok(doc) => Ok(doc),
        // No report at all: what it said on its way out is the reason.
        Err(_) if !finished.status.success() => {
            bail!("netlane kv load on {} failed ({}): {}", host.name(), finished.status, finished.stderr_tail())
        }
        Err(e) => Err(e).context("read the load generator's report"),
    }
}

/// How long `step` may take at most before the process is killed: every run it can make,
/// each as long as it is asked to be plus a second, and a minute more (a warm-up: a
/// millisecond a key, and a minute).
pub(crate) fn time_limit(cfg: &LoadConfig, step: LoadStep) -> Duration {
    let run = cfg.ramp + cfg.duration + cfg.drain + Duration::from_secs(1);
    let minute = Duration::from_secs(60);
    match step {
        LoadStep::WarmUp => minute + Duration::from_millis(cfg.workload.keys),
        LoadStep::Run | LoadStep::Agent => run + minute,
        // Up to five runs per rate; the rates: the floor, each bisection, and as many
        // confirmations again (a failed one confirms the next lower rate).
        LoadStep::Search { range, .. } => run * 5 * (2 * range.max_bisections + 2) + minute,
    }
}
