//! HDR histograms of nanosecond (or any integer) values, summarised as percentiles.

mod wire;

use hdrhistogram::Histogram;
use serde::Serialize;

pub use wire::{Bounds, HistWireError, MAX_ENCODED, decode, encode};

/// A histogram of values from 1 to one hour in nanoseconds, 3 significant digits.
/// Zero is recorded as zero; values above an hour are clamped (and so still counted).
#[derive(Debug, Clone)]
pub struct Hist {
    h: Histogram<u64>,
}

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

/// A histogram summarized: count, extremes, mean and percentiles, in the unit of its
/// values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Summary {
    /// Number of values.
    pub count: u64,
    /// Smallest value.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Largest value.
    pub max: u64,
}

const HIGHEST: u64 = 3_600_000_000_000;

/// A [`Hist`]'s bounds: what [`Hist::decode`] takes.
pub const HIST_BOUNDS: Bounds = Bounds { lowest: 1, highest: HIGHEST, digits: 3 };

impl Hist {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            // 1..=1h with 3 significant digits is a valid configuration
            // (hdrhistogram: sigfig <= 5 and high >= 2 * low).
            h: Histogram::new_with_bounds(HIST_BOUNDS.lowest, HIST_BOUNDS.highest, HIST_BOUNDS.digits)
                .expect("valid histogram bounds"),
        }
    }

    /// Records one value.
    pub fn record(&mut self, v: u64) {
        self.h.saturating_record(v.min(HIGHEST));
    }

    /// Adds another histogram's values.
    pub fn merge(&mut self, other: &Hist) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.h.add(&other.h);
    }

    /// In HdrHistogram's serialized form ([`encode`]).
    pub fn encoded(&self) -> String {
        encode(&self.h)
    }

    /// A histogram another process sent ([`Hist::encoded`]), checked ([`decode`]).
    pub fn decode(text: &str) -> Result<Hist, HistWireError> {
        decode(text, HIST_BOUNDS).map(|h| Hist { h })
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// The value at quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> u64 {
        self.h.value_at_quantile(q)
    }

    /// Percentile summary.
    pub fn summary(&self) -> Summary {
        if self.h.is_empty() {
            return Summary::default();
        }
        Summary {
            count: self.h.len(),
            min: self.h.min(),
            mean: self.h.mean(),
            p50: self.h.value_at_quantile(0.50),
            p90: self.h.value_at_quantile(0.90),
            p99: self.h.value_at_quantile(0.99),
            p999: self.h.value_at_quantile(0.999),
            p9999: self.h.value_at_quantile(0.9999),
            max: self.h.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut h = Hist::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50 as f64 / 500_000.0 - 1.0).abs() < 0.01);
        assert!((s.p99 as f64 / 990_000.0 - 1.0).abs() < 0.01);
        assert!(s.max >= 999_000);
        let mut other = Hist::new();
        other.record(0);
        h.merge(&other);
        assert_eq!(h.count(), 1001);
        assert_eq!(Hist::new().summary(), Summary::default());
        let back = Hist::decode(&h.encoded()).unwrap();
        assert_eq!((back.count(), back.summary()), (h.count(), h.summary()));
    }
}
