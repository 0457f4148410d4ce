//! What the cache scenarios (kv, lanes) share: the server under test (netlane's or
//! memcached), waiting until it accepts, the warm-up and the SLA search as steps of a
//! round, and what makes a load run sound enough to stand for the server.

pub(crate) mod agents;
pub(crate) mod role;
mod site;

pub(crate) use site::CacheSite;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};
use netlane_kv::load::schedule::{Arrivals, Pacing, Process};
use netlane_kv::load::search::{GENERATOR_LAG_MAX, SearchConfig};
use netlane_kv::load::stats::Sla;
use netlane_kv::load::workload::WorkloadSpec;
use netlane_kv::loadgen::{LoadConfig, LoadReport, SearchReport};
use netlane_kv::server::{LanesView, ServerConfig};
use netlane_kv::store::StoreConfig;

use crate::host::{Program, RoleProcess, RoleSpec};
use crate::runner::{Runner, Turn};
use crate::verdict::Measure;

/// Whether `p` names a program: a path to a file, or a name found on `PATH`.
pub(crate) fn program_exists(p: &str) -> bool {
    if p.contains('/') {
        return std::path::Path::new(p).is_file();
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
}

/// Open-loop Poisson arrivals at `rate` per second.
pub(crate) fn open(rate: f64) -> Pacing {
    Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: rate })
}

/// A cache server's process in the rx namespace, netlane's or memcached; stopped with
/// SIGINT when dropped (netlane's then puts back the device settings its lanes changed),
/// killed by the PID we started if it does not end.
pub(crate) struct CacheServer {
    process: Option<RoleProcess>,
    /// Whether it is netlane's, which writes its final counters when it stops.
    netlane: bool,
    /// `net.core.busy_poll` as set for it, if it was (put back when this drops).
    _busy_poll: Option<netlane::installed::Sysctl>,
}

/// How long a cache server may take to stop.
const STOP_GRACE: Duration = Duration::from_secs(10);

impl CacheServer {
    /// The server `spec` describes (`netlane`: netlane's own), started on the site's
    /// server host.
    pub(crate) fn start(
        site: &CacheSite<'_>,
        spec: &RoleSpec,
        netlane: bool,
        busy_poll: Option<netlane::installed::Sysctl>,
    ) -> Result<CacheServer> {
        Ok(CacheServer { process: Some(RoleProcess::start(site.server, spec, None)?), netlane, _busy_poll: busy_poll })
    }

    /// Stops it and, when it is netlane's, reads what its lanes did from its final
    /// counters.
    pub(crate) fn stop(mut self) -> Result<Option<LanesView>> {
        let Some(process) = self.process.take() else { return Ok(None) };
        let finished = process.stop(STOP_GRACE)?;
        if self.netlane { role::kv_serve_lanes(&finished).map(Some) } else { Ok(None) }
    }
}

impl Drop for CacheServer {
    fn drop(&mut self) {
        if let Some(p) = self.process.take()
            && let Err(e) = p.stop(STOP_GRACE)
        {
            tracing::warn!("stopping the cache server: {e:#}");
        }
    }
}

/// memcached as a role: on `cpus`, serving `addr` over TCP only with `threads` threads,
/// 1 GiB and `max_conns` connections. A server that cannot start shows as one that
/// never accepts (and its error in the message that says so).
pub(crate) fn memcached_spec(
    program: &str,
    addr: SocketAddr,
    cpus: &[usize],
    threads: usize,
    max_conns: u32,
) -> RoleSpec {
    let mut args: Vec<String> = ["-l", &addr.ip().to_string(), "-p", &addr.port().to_string(), "-U", "0"]
        .into_iter()
        .map(String::from)
        .collect();
    args.extend(["-t".into(), threads.to_string(), "-m".into(), "1024".into(), "-c".into(), max_conns.to_string()]);
    if nix::unistd::geteuid().is_root() {
        args.extend(["-u".into(), "root".into()]);
    }
    RoleSpec::program(&format!("memcached ({program})"), Program::Other(program.into()), args).on_cpus(cpus)
}

/// `netlane kv serve` as a role: on `cpu`, serving `addr` over TCP only with `threads`
/// workers pinned there, 1 GiB, 1 MiB items and `max_conns` connections.
pub(crate) fn netlane_kv_spec(addr: SocketAddr, cpu: usize, threads: usize, max_conns: u32) -> RoleSpec {
    let cfg = ServerConfig {
        listen: addr,
        threads,
        cpus: Some(vec![cpu]),
        store: StoreConfig::new(1 << 30, 1 << 20, 64),
        max_conns: max_conns as usize,
        ..ServerConfig::default()
    };
    role::kv_serve_spec(&cfg, &[cpu])
}

/// Stores the key space from the generator's side, a step of `who`'s round.
pub(crate) fn warm_up(
    runner: &mut Runner<'_>,
    turn: Turn,
    site: &CacheSite<'_>,
    who: &str,
    cfg: LoadConfig,
) -> Result<u64> {
    runner.step(turn, &format!("{who} warm-up"), |_| {
        let n = site.warm_up(&cfg)?;
        Ok((n, format!("{n} keys stored")))
    })
}

/// The highest rate within `sla` from the generator's side, a recorded step of `who`'s
/// round.
pub(crate) fn search(
    runner: &mut Runner<'_>,
    turn: Turn,
    site: &CacheSite<'_>,
    who: &str,
    cfg: LoadConfig,
    sla: Sla,
    range: SearchConfig,
) -> Result<SearchReport> {
    let what = format!("{who} search {sla}");
    let r = runner.step(turn, &what, |_| {
        let r = site.search(&cfg, sla, range)?;
        let line = match r.best_per_s {
            Some(b) => format!(
                "{b:.0} requests/s{} ({} rates, {} runs)",
                if r.capped {
                    " (capped)"
                } else if r.generator_limited {
                    " (the generator's limit)"
                } else {
                    ""
                },
                r.curve.len(),
                r.runs
            ),
            None => format!("no rate held it ({} rates, {} runs)", r.curve.len(), r.runs),
        };
        Ok((r, line))
    })?;
    runner.record(turn, &what, vec![("best_per_s", r.best_per_s), ("runs", Some(r.runs as f64))], &r);
    Ok(r)
}

/// A latency percentile of a load report, in µs, where it was measured.
pub(crate) fn pct(l: &LoadReport, p: &str) -> Option<f64> {
    l.latency_ns.us(p)
}

/// A run that answered what was offered: all of it, without errors, sent when it
/// could go (a send the generator itself delayed, not one waiting for the server, is a
/// lagged one: beyond [`GENERATOR_LAG_MAX`] of them the generator measured itself).
/// Anything else cannot stand for the server's cost or latency.
pub(crate) fn sound(l: &LoadReport) -> Result<(), String> {
    let c = &l.counts;
    // A closed loop has no schedule to keep: its sends wait for answers by design.
    if l.mode == "open" && l.lag_share > GENERATOR_LAG_MAX {
        return Err(format!(
            "the generator delayed {:.1}% of its sends itself (its CPU {:.0}% busy): it measured itself",
            l.lag_share * 100.0,
            l.client_cpu_busy * 100.0
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

/// A load generator's configuration with the defaults every cache scenario runs with
/// (a 200 ms ramp, 64 requests in flight per connection at most, a send later than
/// 100 µs counted late, 500 ms to drain, seed 1).
pub(crate) fn load_config(
    server: SocketAddr,
    (connections, threads): (u32, usize),
    cpus: Vec<usize>,
    pacing: Pacing,
    workload: WorkloadSpec,
    duration: Duration,
) -> LoadConfig {
    LoadConfig {
        server,
        connections,
        threads,
        cpus: (!cpus.is_empty()).then_some(cpus),
        pacing,
        workload,
        duration,
        ramp: Duration::from_millis(200),
        max_in_flight: 64,
        late_after: Duration::from_micros(100),
        drain: Duration::from_millis(500),
        seed: 1,
    }
}

/// The search's range: `0 < lo < hi`, and a resolution (the ratio two rates a search
/// still tells apart) above 1.
pub(crate) fn check_search_range(lo: f64, hi: f64, resolution: f64) -> Result<()> {
    if !(lo > 0.0 && lo < hi && hi.is_finite()) {
        bail!("--search-lo {lo} / --search-hi {hi}: 0 < lo < hi");
    }
    if !(resolution > 1.0 && resolution.is_finite()) {
        bail!("--resolution {resolution}: a ratio above 1");
    }
    Ok(())
}

/// Percentile `p` of a sound run, in µs.
pub(crate) fn latency_of(l: &LoadReport, p: &str) -> Measure {
    sound(l)?;
    pct(l, p).ok_or_else(|| format!("{p} fell among failed requests"))
}

#[cfg(test)]
pub(crate) mod tests {
    use netlane_kv::loadgen::{CountsView, LoadReport};

    /// A load run at `rate` for 3 s whose p99.9 is `p999_us` (other percentiles a tenth of
    /// it), the generator having delayed `lag` of its sends.
    pub(in crate::scenarios) fn load(rate: f64, p999_us: f64, lag: f64) -> LoadReport {
        let n = (rate * 3.0) as u64;
        LoadReport {
            mode: "open".into(),
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
            latency_ns: {
                let ns = |us: f64| Some((us * 1e3) as u64);
                netlane_kv::loadgen::RequestLatency {
                    count: n,
                    min: ns(p999_us / 100.0),
                    mean: Some(p999_us * 1e3 / 20.0),
                    p50: ns(p999_us / 10.0),
                    p90: ns(p999_us / 10.0),
                    p99: ns(p999_us / 10.0),
                    p999: ns(p999_us),
                    p9999: ns(p999_us / 10.0),
                    max: ns(p999_us),
                }
            },
            late_share: lag,
            lag_share: lag,
            connection_failures: 0,
            client_cpu_s: 1.0,
            client_cpu_busy: 0.5,
        }
    }
}
