//! What the lanes scenario's checks compare: sound runs, and the quantities taken from
//! them (CPU per request, latency percentiles, the best rate within the SLA).

use anyhow::Result;
use netlane_kv::loadgen::LoadReport;

use crate::scenarios::cache;
pub(crate) use crate::scenarios::cache::{latency_of, pct};
pub(crate) use crate::stats::med;
use crate::verdict::{Measure, positive};

use super::*;

/// A run that answered everything offered, sent on time: anything else cannot stand for
/// the server.
pub(crate) fn sound(r: &LaneRun) -> Result<(), String> {
    cache::sound(&r.load)
}

/// CPU µs per request over every CPU of the machine, the generator's threads excluded (the NAPI work
/// of both ends and the server's remain).
pub(crate) fn cpu_per_request(r: &LaneRun) -> Measure {
    sound(r)?;
    let per = positive(r.load.counts.completed as f64, "completed requests")?;
    positive((r.busy_s - r.load.client_cpu_s) * 1e6 / per, "CPU per request")
}

pub(crate) fn per_request(r: &LaneRun, n: u64) -> Measure {
    sound(r)?;
    Ok(n as f64 / positive(r.load.counts.completed as f64, "completed requests")?)
}

pub(crate) fn latency(p: &'static str) -> impl Fn(&LaneRun) -> Measure {
    move |r| {
        sound(r)?;
        pct(&r.load, p).ok_or_else(|| format!("{p} fell among failed requests"))
    }
}

pub(crate) fn mean(r: &LaneRun) -> Measure {
    mean_of(&r.load)
}

/// The mean latency of a sound run.
pub(crate) fn mean_of(l: &LoadReport) -> Measure {
    cache::sound(l)?;
    l.latency_ns.mean.map(|ns| ns / 1e3).ok_or_else(|| "nothing completed".into())
}

pub(crate) fn summary(r: &LaneRun) -> String {
    let l = &r.load;
    let f = |p| pct(l, p).map_or("failed".to_string(), |v| format!("{v:.0} us"));
    format!(
        "{:.0}/s of {:.0}/s, mean {}, p99 {}, p99.9 {}, CPU {:.2} us/request, {:.2} context switches and {:.2} IPIs per request (lagged {:.1}%)",
        l.achieved_per_s,
        l.offered_per_s,
        l.latency_ns.mean.map_or("-".into(), |m| format!("{:.0} us", m / 1e3)),
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
pub(crate) fn best(r: &LaneRound) -> Measure {
    best_of(r.search.as_ref().ok_or("the search did not run")?, r.mode)
}

/// A search's best rate; invalid when none held, every one did, or the generator's limit
/// bounded it.
pub(crate) fn best_of(s: &netlane_kv::loadgen::SearchReport, mode: Mode) -> Measure {
    match s.best_per_s {
        None => Err(format!("{}: no rate held {}", mode.name(), s.sla)),
        Some(_) if s.capped => Err(format!("{}: every rate held {}: raise --search-hi", mode.name(), s.sla)),
        Some(_) if s.generator_limited => {
            Err(format!("{}: the search stopped where the generator could not keep its schedule", mode.name()))
        }
        Some(b) => positive(b, "best rate"),
    }
}
