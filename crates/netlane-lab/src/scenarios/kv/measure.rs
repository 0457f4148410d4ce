//! The kv scenario's runs: a server started fresh for each round, its warm-up, the floor
//! under cyclictest, the SLA searches, the fixed rates and the closed loop against an
//! open one, with the server CPU's busy time around each load run.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};
use netlane_kv::load::schedule::Pacing;
use netlane_kv::load::search::SearchConfig;
use netlane_kv::loadgen::{LoadConfig, LoadReport, SearchReport};
use serde::Serialize;

use super::checks::cpu_per_request;
use super::{KvBenchArgs, Part, ServerKind};
use crate::engines::stalls::{self, Stalls};
use crate::progress::Progress;
use crate::runner::{Measured, Runner, Turn};
use crate::scenarios::cache::agents::AgentSummary;
use crate::scenarios::cache::{self, CacheServer, CacheSite, memcached_spec, netlane_kv_spec, open, pct};
use crate::scenarios::unless_generator_lagged;

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
    /// Each load generator agent's part of the run (none from one generator alone).
    pub agents: Vec<AgentSummary>,
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
    /// Closed loop, then open loop at 80% (`OPEN_SHARE`) of the closed loop's rate.
    pub closed: Option<(KvRun, KvRun)>,
    /// The floor: a run at the lowest search rate, and the stalls cyclictest saw on the
    /// server CPU during it.
    pub floor: Option<(KvRun, Stalls)>,
}

/// The open loop of the closed part is offered this share of the closed loop's rate.
pub(super) const OPEN_SHARE: f64 = 0.8;

impl Measured for KvRun {
    fn summary(&self) -> String {
        let l = &self.load;
        let f = |p| pct(l, p).map_or("failed".to_string(), |v| format!("{v:.0} us"));
        format!(
            "{:.0}/s achieved of {:.0}/s, p99 {}, p99.9 {}, server CPU {:.2} us/request, generator CPU {:.0}% (lagged {:.1}%)",
            l.achieved_per_s,
            l.offered_per_s,
            f("p99"),
            f("p99.9"),
            cpu_per_request(self).unwrap_or(f64::NAN),
            l.client_cpu_busy * 100.0,
            l.lag_share * 100.0
        )
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        let l = &self.load;
        vec![
            ("offered_per_s", Some(l.offered_per_s)),
            ("achieved_per_s", Some(l.achieved_per_s)),
            ("p50_us", pct(l, "p50")),
            ("p99_us", pct(l, "p99")),
            ("p999_us", pct(l, "p99.9")),
            ("server_cpu_us_per_request", cpu_per_request(self).ok()),
            ("generator_cpu_busy_pct", Some(l.client_cpu_busy * 100.0)),
        ]
    }
}

impl KvBenchArgs {
    fn start(&self, site: &CacheSite<'_>, addr: SocketAddr, kind: ServerKind) -> Result<CacheServer> {
        let running = match kind {
            ServerKind::Netlane => {
                let spec = netlane_kv_spec(addr, self.server_cpu, self.threads, self.connections + 64);
                CacheServer::start(site, &spec, true, None)?
            }
            ServerKind::Memcached => {
                let spec =
                    memcached_spec(&self.memcached, addr, &[self.server_cpu], self.threads, self.connections + 64);
                CacheServer::start(site, &spec, false, None)?
            }
        };
        site.wait_until_accepting(addr, &kind.name())?;
        Ok(running)
    }

    /// One load run with the server CPU's busy time around it.
    fn measured_once(&self, site: &CacheSite<'_>, cfg: LoadConfig) -> Result<KvRun> {
        let cpu0 = site.server_cpu(self.server_cpu)?;
        let (r, agents) = site.run_with_agents(&cfg)?;
        let cpu1 = site.server_cpu(self.server_cpu)?;
        let d = cpu0.delta(&cpu1);
        Ok(KvRun { load: r, server_busy_s: d.busy_s, server_total_s: d.total_s, discarded: 0, agents })
    }

    /// [`Self::measured_once`], made again when the generator lagged in it.
    fn unlagged(&self, progress: &dyn Progress, label: &str, site: &CacheSite<'_>, cfg: LoadConfig) -> Result<KvRun> {
        let (mut run, discarded) =
            unless_generator_lagged(progress, label, || self.measured_once(site, cfg.clone()), |r| &r.load)?;
        run.discarded = discarded;
        Ok(run)
    }

    /// [`Self::unlagged`] as a run of the round, recorded under `what`.
    fn measured(
        &self,
        runner: &mut Runner<'_>,
        turn: Turn,
        what: &str,
        site: &CacheSite<'_>,
        cfg: LoadConfig,
    ) -> Result<KvRun> {
        let progress = runner.progress();
        runner.measure(turn, what, |label| self.unlagged(progress, label, site, cfg))
    }

    /// One server's round: started fresh, the key space stored, then each part asked.
    pub(super) fn round(
        &self,
        runner: &mut Runner<'_>,
        site: &CacheSite<'_>,
        addr: SocketAddr,
        kind: ServerKind,
        turn: Turn,
    ) -> Result<KvRound> {
        let who = kind.name();
        let _server = self.start(site, addr, kind)?;
        cache::warm_up(runner, turn, site, &who, self.load(addr, open(self.search_lo), self.step))?;
        let mut out =
            KvRound { server: who.clone(), searches: Vec::new(), rates: Vec::new(), closed: None, floor: None };
        if self.probes_stalls() {
            out.floor = Some(self.floor(runner, turn, site, addr, &who)?);
        }
        if self.parts.contains(&Part::Sla) {
            for sla in [self.sla, self.tight_sla] {
                let range = SearchConfig {
                    lo_per_s: self.search_lo,
                    hi_per_s: self.search_hi,
                    resolution: self.resolution,
                    max_bisections: 12,
                };
                let cfg = self.load(addr, open(self.search_lo), self.step);
                out.searches.push(cache::search(runner, turn, site, &who, cfg, sla, range)?);
            }
        }
        if self.parts.contains(&Part::Rates) {
            for rate in &self.rates {
                let cfg = self.load(addr, open(*rate as f64), self.time);
                out.rates.push(self.measured(runner, turn, &format!("{who} {rate}/s"), site, cfg)?);
            }
        }
        if self.parts.contains(&Part::Closed) {
            out.closed = Some(self.closed_and_open(runner, turn, site, addr, &who)?);
        }
        Ok(out)
    }

    /// A run at the lowest search rate with cyclictest on the server CPU meanwhile.
    fn floor(
        &self,
        runner: &mut Runner<'_>,
        turn: Turn,
        site: &CacheSite<'_>,
        addr: SocketAddr,
        who: &str,
    ) -> Result<(KvRun, Stalls)> {
        let what = format!("{who} floor at {:.0}/s", self.search_lo);
        let floor = runner.step(turn, &format!("{what} with cyclictest"), |_| {
            let (cpu, dur) = (self.server_cpu, self.stall_probe);
            let (run, st) = std::thread::scope(|sc| {
                let server = site.server;
                let probe = sc.spawn(move || stalls::probe(server, cpu, dur, Duration::from_millis(1)));
                let run = self.measured_once(site, self.load(addr, open(self.search_lo), dur));
                (run, probe.join().unwrap_or_else(|_| Err(stalls::StallError::Output("the probe panicked".into()))))
            });
            let (run, st) = (run?, st?);
            let line = format!(
                "{}; cyclictest: {} stalls >= 1 ms (max {} us), alone delaying {:.3}% of requests past 1 ms",
                run.summary(),
                st.over_1ms,
                st.max_us,
                st.delayed_share(1000) * 100.0
            );
            Ok(((run, st), line))
        })?;
        runner.record(turn, &what, floor.0.figures(), &floor.0);
        Ok(floor)
    }

    /// A closed loop, then an open loop at [`OPEN_SHARE`] of the rate it reached.
    fn closed_and_open(
        &self,
        runner: &mut Runner<'_>,
        turn: Turn,
        site: &CacheSite<'_>,
        addr: SocketAddr,
        who: &str,
    ) -> Result<(KvRun, KvRun)> {
        let cfg = self.load(addr, Pacing::Closed { depth: self.closed_depth }, self.time);
        let closed = self.measured(runner, turn, &format!("{who} closed loop"), site, cfg)?;
        // A closed loop runs the generator flat out; the open loop is offered a share
        // of that rate so that the generator keeps its schedule.
        let rate = closed.load.achieved_per_s * OPEN_SHARE;
        if rate <= 0.0 {
            bail!("{who}: the closed loop completed nothing");
        }
        let progress = runner.progress();
        let opened = runner.step(turn, &format!("{who} open loop at 80% of the closed loop's rate"), |label| {
            let run = self.unlagged(progress, label, site, self.load(addr, open(rate), self.time))?;
            let line = run.summary();
            Ok((run, line))
        })?;
        runner.record(turn, &format!("{who} open loop at {rate:.0}/s"), opened.figures(), &opened);
        Ok((closed, opened))
    }
}
