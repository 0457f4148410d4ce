//! A tail-latency objective, `p99.9=1ms`: what every load generator judges its run by
//! (`kv load`, `rr clients`, `nvme perf` with `--sla`).

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// The longest latency an objective may name (and the generators' histograms hold): 60 s.
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// A tail-latency objective: `percentile` of requests within `latency`.
///
/// ```
/// use netlane::metrics::sla::Sla;
///
/// let sla: Sla = "p99.9=1ms".parse()?;
/// assert!((sla.quantile() - 0.999).abs() < 1e-12);
/// assert_eq!(sla.latency_ns(), 1_000_000);
/// assert!(sla.is_met_at(Some(800_000)));
/// // No latency at the percentile: it fell among requests that got no answer.
/// assert!(!sla.is_met_at(None));
/// assert_eq!(sla.to_string(), "p99.9=1ms");
/// assert!("p99.9".parse::<Sla>().is_err());
/// # Ok::<(), netlane::metrics::sla::SlaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sla {
    percentile: f64,
    latency_ns: u64,
}

/// An SLA that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SlaError {
    /// Not `pPERCENTILE=LATENCY`.
    #[error("SLA {0:?}: expected pPERCENTILE=LATENCY, like p99.9=1ms")]
    Syntax(String),
    /// A percentile that is not a number in (0, 100].
    #[error("SLA percentile {0:?}: must be a number above 0 and at most 100")]
    Percentile(String),
    /// A latency that is not a positive number with a unit, up to 60 s.
    #[error("SLA latency {0:?}: expected a number and a unit (ns, us, ms or s), from 1 ns to 60 s")]
    Latency(String),
}

impl Sla {
    /// The percentile, as a fraction (0.999 for p99.9).
    pub fn quantile(&self) -> f64 {
        self.percentile / 100.0
    }

    /// The latency bound, ns.
    pub fn latency_ns(&self) -> u64 {
        self.latency_ns
    }

    /// Whether a run whose latency at this percentile was `at` meets it (`None`: the
    /// percentile fell among requests without an answer, which no bound holds).
    pub fn is_met_at(&self, at: Option<u64>) -> bool {
        at.is_some_and(|ns| ns <= self.latency_ns)
    }
}

impl FromStr for Sla {
    type Err = SlaError;

    /// `p99.9=1ms`: a percentile, `=`, a latency with a unit (`ns`, `us`, `µs`, `ms`, `s`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((p, latency)) = s.strip_prefix('p').and_then(|r| r.split_once('=')) else {
            return Err(SlaError::Syntax(s.to_owned()));
        };
        let percentile = p
            .parse::<f64>()
            .ok()
            .filter(|p| *p > 0.0 && *p <= 100.0)
            .ok_or_else(|| SlaError::Percentile(p.to_owned()))?;
        let units: [(&str, f64); 5] = [("ns", 1.0), ("us", 1e3), ("µs", 1e3), ("ms", 1e6), ("s", 1e9)];
        let latency_ns = units
            .iter()
            .find_map(|(unit, scale)| latency.strip_suffix(unit).map(|n| (n, scale)))
            .and_then(|(n, scale)| n.parse::<f64>().ok().map(|n| (n * scale).round()))
            .filter(|ns| *ns >= 1.0 && *ns <= MAX_LATENCY_NS as f64)
            .ok_or_else(|| SlaError::Latency(latency.to_owned()))? as u64;
        Ok(Sla { percentile, latency_ns })
    }
}

impl fmt::Display for Sla {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.latency_ns;
        let (n, unit) = [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")]
            .into_iter()
            .find(|(scale, _)| ns.is_multiple_of(*scale))
            .map_or((ns, "ns"), |(scale, unit)| (ns / scale, unit));
        write!(f, "p{}={n}{unit}", self.percentile)
    }
}
