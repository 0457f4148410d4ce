//! The rate search's driver: short runs at the rates the search asks for, each rate
//! decided by a vote of runs, and the report of the rates tried.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::drive::run;
use super::{LoadConfig, LoadError};
use crate::load::schedule::{Arrivals, Pacing};
use crate::load::search::{Outcome, Point, RateSearch, SearchConfig, Verdict, Vote, decided, judge};
use crate::load::stats::{Measurement, Sla};

/// A rate search's result.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchReport {
    /// The SLA, as given.
    pub sla: String,
    /// The highest offered rate that met it, confirmed by a second run (`None`: no rate
    /// did).
    pub best_per_s: Option<f64>,
    /// The best rate is the upper bound: the server may hold more.
    pub capped: bool,
    /// Above the best rate the generator could not keep its schedule: the server may
    /// hold more than the generator can offer.
    pub generator_limited: bool,
    /// The rates decided, in order: rate asked, offered, achieved, the SLA percentile
    /// (µs), verdict (each decided by three runs of five, or two clear ones).
    pub curve: Vec<CurvePoint>,
    /// Runs made (two to five per rate).
    pub runs: usize,
}

/// One run of a search.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CurvePoint {
    /// Rate asked for.
    pub rate_per_s: f64,
    /// Offered per second.
    pub offered_per_s: f64,
    /// Completed per second.
    pub achieved_per_s: f64,
    /// Latency at the SLA percentile, ns (`None`: among failed requests).
    pub sla_latency_ns: Option<u64>,
    /// met, missed, fell-behind, idle or generator-bound.
    pub verdict: String,
    /// A confirmation of an earlier rate.
    pub confirmation: bool,
}

fn curve_point(p: &Point) -> CurvePoint {
    CurvePoint {
        rate_per_s: p.rate_per_s,
        offered_per_s: p.measured.offered_per_s,
        achieved_per_s: p.measured.achieved_per_s,
        sla_latency_ns: p.measured.sla_latency_ns,
        verdict: match p.verdict {
            Verdict::Met => "met",
            Verdict::SlaMissed => "missed",
            Verdict::FellBehind => "fell-behind",
            Verdict::Idle => "idle",
            Verdict::GeneratorBound => "generator-bound",
        }
        .into(),
        confirmation: p.confirmation,
    }
}

/// Checks what a [`search`] is asked for before anything is sent (the warm-up
/// included).
pub fn check_search(cfg: &LoadConfig, range: SearchConfig) -> Result<(), LoadError> {
    if !matches!(cfg.pacing, Pacing::Open(_)) {
        return Err(LoadError::Config("a search needs open loop (a rate, not a closed loop)".into()));
    }
    RateSearch::new(range).map(|_| ()).map_err(|e| LoadError::Config(e.to_string()))
}

/// Finds the highest open-loop rate whose `sla` percentile holds: bisection over short
/// runs of `cfg.duration` at `cfg.pacing`'s arrival process, each rate decided by three
/// runs of five, or by two that agree far from the bound ([`decided`]), the best rate
/// decided again to confirm it.
/// `progress` sees every run as it ends.
pub fn search(
    cfg: &LoadConfig,
    sla: Sla,
    range: SearchConfig,
    stop: &AtomicBool,
    progress: impl FnMut(&RunPoint),
) -> Result<SearchReport, LoadError> {
    let window = cfg.duration.as_nanos() as u64;
    search_with(cfg, sla, range, stop, progress, |c| run(c, stop).map(|r| r.stats.measure(&sla, window)))
}

/// [`search`], each run made by `run_one` (several agents, say) and judged by what it
/// returns: the run of a configuration measured against `sla`.
pub fn search_with<E: From<LoadError>>(
    cfg: &LoadConfig,
    sla: Sla,
    range: SearchConfig,
    stop: &AtomicBool,
    mut progress: impl FnMut(&RunPoint),
    mut run_one: impl FnMut(&LoadConfig) -> Result<Measurement, E>,
) -> Result<SearchReport, E> {
    let Pacing::Open(arrivals) = cfg.pacing else {
        return Err(LoadError::Config("a search needs open loop (a rate, not a closed loop)".into()).into());
    };
    let mut s = RateSearch::new(range).map_err(|e| LoadError::Config(e.to_string()))?;
    let mut run_cfg = cfg.clone();
    let mut runs = 0;
    while let Some(rate) = s.next_rate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        run_cfg.pacing = Pacing::Open(Arrivals { rate_per_s: rate, ..arrivals });
        // Each rate is verified (search::decided): three runs of five on one side, or
        // two that agree far from the bound. The search records a run of the winning side.
        let mut votes: Vec<Measurement> = Vec::new();
        let mut ballots: Vec<Vote> = Vec::new();
        let bound = sla.latency_ns() as f64;
        let held = loop {
            run_cfg.seed = run_cfg.seed.wrapping_add(1);
            let m = run_one(&run_cfg)?;
            runs += 1;
            let held = holds(&m, rate);
            progress(&RunPoint { rate_per_s: rate, vote: votes.len() + 1, met: held, measured: m });
            let kept_up = matches!(judge(rate, &m), Verdict::Met | Verdict::SlaMissed);
            ballots.push(Vote { held, ratio: m.sla_latency_ns.filter(|_| kept_up).map(|ns| ns as f64 / bound) });
            votes.push(m);
            if let Some(d) = decided(&ballots) {
                break d;
            }
            if stop.load(Ordering::Relaxed) {
                break false;
            }
        };
        let chosen = votes.iter().rev().find(|v| holds(v, rate) == held).copied().unwrap_or(votes[0]);
        s.record(chosen).map_err(|e| LoadError::Config(e.to_string()))?;
    }
    let (best, capped, generator_limited) = match s.outcome() {
        Some(Outcome::Found { point, capped, generator_limited }) => {
            (Some(point.rate_per_s), capped, generator_limited)
        }
        _ => (None, false, false),
    };
    Ok(SearchReport {
        sla: sla.to_string(),
        best_per_s: best,
        capped,
        generator_limited,
        curve: s.curve().iter().map(curve_point).collect(),
        runs,
    })
}

/// One run of a search, as it ends.
#[derive(Debug, Clone, Copy)]
pub struct RunPoint {
    /// The rate asked for.
    pub rate_per_s: f64,
    /// Which run at this rate (1..=3).
    pub vote: usize,
    /// Whether it kept up and held the SLA.
    pub met: bool,
    /// What it measured.
    pub measured: Measurement,
}

/// Whether a run kept up with the rate and held the SLA: the search's own rule.
fn holds(m: &Measurement, rate: f64) -> bool {
    judge(rate, m) == Verdict::Met
}
