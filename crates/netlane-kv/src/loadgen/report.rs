//! What a run measured: the report (serialized), its counters, and the full statistics
//! an SLA verdict needs.

use serde::{Deserialize, Serialize};

use super::LoadConfig;
use crate::load::schedule::Pacing;
use crate::load::stats::{Counts, REPORTED_QUANTILES, Stats};

/// What one run measured.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LoadReport {
    /// Open or closed loop: `open` or `closed`.
    pub mode: String,
    /// The offered rate asked for (open loop), requests/s.
    pub target_per_s: Option<f64>,
    /// Length of the measured window, s (after the ramp).
    pub seconds: f64,
    /// Requests offered per second of the window.
    pub offered_per_s: f64,
    /// Requests completed per second of the window.
    pub achieved_per_s: f64,
    /// Every counter.
    pub counts: CountsView,
    /// The requests' latency, ns.
    pub latency_ns: RequestLatency,
    /// Share of sends later than the lateness tolerance after their scheduled time (the
    /// server's delay included: a connection with every slot in flight waits).
    pub late_share: f64,
    /// Share of sends the generator itself delayed past the tolerance, after they could
    /// go: above a few percent the run measured the generator.
    pub lag_share: f64,
    /// Connections that failed during the run.
    pub connection_failures: u64,
    /// CPU time of the generator's threads (user + system), s.
    pub client_cpu_s: f64,
    /// That CPU time over the threads' wall time: near 1.0, the generator itself may be
    /// the bottleneck.
    pub client_cpu_busy: f64,
}

impl LoadReport {
    /// Why the run measured nothing it can be trusted for, if so: no request answered,
    /// a connection lost, or most requests never sent.
    pub fn failure(&self) -> Option<String> {
        let c = &self.counts;
        if c.completed == 0 {
            Some("no request was answered".into())
        } else if self.connection_failures > 0 {
            Some(format!("{} connections failed during the run ({} requests lost)", self.connection_failures, c.lost))
        } else if c.not_sent * 2 > c.offered {
            Some(format!("{} of {} requests were never sent", c.not_sent, c.offered))
        } else {
            None
        }
    }

    /// The summary of a run of `cfg`: its threads' (or agents') statistics merged, the
    /// connections that failed, and the threads' CPU time and wall time, s.
    pub fn summarize(cfg: &LoadConfig, stats: &Stats, failures: u64, cpu: f64, wall: f64) -> LoadReport {
        let seconds = cfg.duration.as_secs_f64();
        let c = *stats.counts();
        LoadReport {
            mode: if matches!(cfg.pacing, Pacing::Open(_)) { "open" } else { "closed" }.into(),
            target_per_s: match cfg.pacing {
                Pacing::Open(a) => Some(a.rate_per_s),
                Pacing::Closed { .. } => None,
            },
            seconds,
            offered_per_s: c.offered as f64 / seconds,
            achieved_per_s: c.completed as f64 / seconds,
            counts: CountsView::from(&c),
            latency_ns: RequestLatency::of(stats),
            late_share: if c.sent == 0 { 0.0 } else { c.sent_late as f64 / c.sent as f64 },
            lag_share: c.lag_share(),
            connection_failures: failures,
            client_cpu_s: cpu,
            client_cpu_busy: if wall > 0.0 { cpu / wall } else { 0.0 },
        }
    }
}

/// The latency of a run's requests, ns, with the keys of every latency summary netlane
/// writes (`count`, `min`, `mean`, `p50` to `p9999`, `max`). A request without a good
/// answer (an error reply, lost with its connection) ranks above every answer, so a
/// percentile that falls among those is `None`; `count`, `min`, `mean` and `max` are the
/// answered requests'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RequestLatency {
    /// Requests answered.
    pub count: u64,
    /// Shortest answer.
    pub min: Option<u64>,
    /// Mean of the answers.
    pub mean: Option<f64>,
    /// Median over every settled request.
    pub p50: Option<u64>,
    /// 90th percentile.
    pub p90: Option<u64>,
    /// 99th percentile.
    pub p99: Option<u64>,
    /// 99.9th percentile.
    pub p999: Option<u64>,
    /// 99.99th percentile.
    pub p9999: Option<u64>,
    /// Longest answer.
    pub max: Option<u64>,
}

impl RequestLatency {
    /// `stats`' latencies.
    pub fn of(stats: &Stats) -> RequestLatency {
        let [p50, p90, p99, p999, p9999] = REPORTED_QUANTILES.map(|q| stats.latency_at(q));
        let range = stats.latency_range();
        RequestLatency {
            count: stats.answered(),
            min: range.map(|r| r.0),
            mean: stats.mean_latency(),
            p50,
            p90,
            p99,
            p999,
            p9999,
            max: range.map(|r| r.1),
        }
    }

    /// The percentile named as an SLA names it (`p99.9`), µs: `None` for one it does not
    /// report or one that falls among the requests without an answer.
    pub fn us(&self, name: &str) -> Option<f64> {
        let ns = match name {
            "p50" => self.p50,
            "p90" => self.p90,
            "p99" => self.p99,
            "p99.9" => self.p999,
            "p99.99" => self.p9999,
            _ => None,
        };
        ns.map(|n| n as f64 / 1e3)
    }
}

/// What a run counted: requests scheduled, sent, answered, and why others were not.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CountsView {
    /// Scheduled.
    pub offered: u64,
    /// Written out.
    pub sent: u64,
    /// Written out late.
    pub sent_late: u64,
    /// Written out late by the generator's own delay.
    pub sent_lagged: u64,
    /// Answered without an error.
    pub completed: u64,
    /// Keys found.
    pub hits: u64,
    /// Keys not found.
    pub misses: u64,
    /// Sets stored.
    pub stored: u64,
    /// Error replies (ERROR, CLIENT_ERROR, SERVER_ERROR).
    pub errors: u64,
    /// In flight when their connection failed.
    pub lost: u64,
    /// In flight at the end.
    pub unanswered: u64,
    /// Never sent.
    pub not_sent: u64,
}

impl From<&Counts> for CountsView {
    fn from(c: &Counts) -> Self {
        CountsView {
            offered: c.offered,
            sent: c.sent,
            sent_late: c.sent_late,
            sent_lagged: c.sent_lagged,
            completed: c.completed,
            hits: c.hits,
            misses: c.misses,
            stored: c.stored,
            errors: c.error + c.client_error + c.server_error,
            lost: c.lost,
            unanswered: c.unanswered,
            not_sent: c.not_sent,
        }
    }
}

/// The result of a run, with its full statistics (for an SLA verdict).
#[derive(Debug)]
pub struct Run {
    /// The summary.
    pub report: LoadReport,
    /// Counters and histogram.
    pub stats: Stats,
    /// The generator threads' wall time, summed, s (what their CPU time is a share of).
    pub threads_wall_s: f64,
}
