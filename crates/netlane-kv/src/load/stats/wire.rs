//! A run's statistics as another process sends them: its counters and its latency
//! histogram in HdrHistogram's standard serialized form, checked before they are taken.

use netlane::metrics::hist;
use thiserror::Error;

use super::{Counts, MAX_LATENCY_NS, Stats};

impl Stats {
    /// The latency histogram in HdrHistogram's standard serialized form (V2), base64:
    /// what another process merges exactly, and HdrHistogram's own tools read.
    pub fn latency_encoded(&self) -> String {
        hist::encode(&self.latency)
    }

    /// A run's statistics from its counters and its [`Stats::latency_encoded`]
    /// histogram, checked before anything is allocated ([`hist::decode`]: a V2
    /// histogram of this module's bounds, 1 ns to 60 s at 3 digits), with one latency per
    /// completed request.
    pub fn from_parts(counts: Counts, latency: &str) -> Result<Stats, WireError> {
        let latency = hist::decode(latency, LATENCY_BOUNDS)?;
        if latency.len() != counts.completed {
            return Err(WireError::Mismatch { latencies: latency.len(), completed: counts.completed });
        }
        // Summed wide: the counts are another process's, any u64 at all.
        let c = &counts;
        let settled: u128 = [c.completed, c.error, c.client_error, c.server_error, c.lost, c.unanswered, c.not_sent]
            .iter()
            .map(|&n| u128::from(n))
            .sum();
        let every = [
            c.offered,
            c.sent,
            c.sent_late,
            c.sent_lagged,
            c.completed,
            c.hits,
            c.misses,
            c.stored,
            c.not_stored,
            c.exists,
            c.not_found,
            c.error,
            c.client_error,
            c.server_error,
            c.lost,
            c.unanswered,
            c.not_sent,
        ];
        if settled > u128::from(c.offered) || every.iter().any(|&n| n > MAX_REQUESTS) {
            return Err(WireError::Counts);
        }
        Ok(Stats { counts, latency })
    }
}

/// The bounds of a run's latency histogram.
const LATENCY_BOUNDS: hist::Bounds = hist::Bounds { lowest: 1, highest: MAX_LATENCY_NS, digits: 3 };

/// More than any run counts of anything (a million requests a second for a day, over
/// a thousand times): counts past it are not a run's, and sums of them cannot overflow.
const MAX_REQUESTS: u64 = 1 << 47;

/// Statistics from another process that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// The histogram is not one to take.
    #[error(transparent)]
    Histogram(#[from] hist::HistWireError),
    /// Latencies and completed requests differ in number.
    #[error("{latencies} latencies for {completed} completed requests")]
    Mismatch {
        /// Latencies in the histogram.
        latencies: u64,
        /// Completed requests.
        completed: u64,
    },
    /// More outcomes than offered requests, or more requests than a run can offer.
    #[error("more requests settled than were offered, or more offered than a run can")]
    Counts,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::stats::REPORTED_QUANTILES;
    use crate::load::stats::tests::ok;

    #[test]
    fn statistics_cross_processes_exactly_and_bad_ones_are_refused() {
        let mut a = Stats::new();
        ok(&mut a, (1..=5_000).map(|i| i * 997 % 3_000_000));
        for _ in 0..3 {
            a.sent(false, false);
        }
        a.unanswered(3);
        let back = Stats::from_parts(*a.counts(), &a.latency_encoded()).unwrap();
        assert_eq!(back.counts(), a.counts());
        assert_eq!(back.latency, a.latency);
        for q in REPORTED_QUANTILES {
            assert_eq!(back.latency_at(q), a.latency_at(q));
        }
        // Two processes' runs merged equal one that recorded both.
        let mut b = Stats::new();
        ok(&mut b, [40_000_000, 7, 123_456]);
        let mut both = a.clone();
        both.merge(&b);
        let mut merged = Stats::from_parts(*a.counts(), &a.latency_encoded()).unwrap();
        merged.merge(&Stats::from_parts(*b.counts(), &b.latency_encoded()).unwrap());
        assert_eq!((merged.counts(), &merged.latency), (both.counts(), &both.latency));

        let encoded = a.latency_encoded();
        let mut c = *a.counts();
        c.completed += 1;
        assert!(matches!(Stats::from_parts(c, &encoded), Err(WireError::Mismatch { .. })));
        // The histogram's own checks are the core's (`netlane::metrics::hist::decode`).
        assert!(matches!(Stats::from_parts(*a.counts(), "not base64!"), Err(WireError::Histogram(_))));
        let mut huge = *a.counts();
        huge.offered = u64::MAX;
        huge.not_sent = u64::MAX;
        assert_eq!(Stats::from_parts(huge, &encoded).unwrap_err(), WireError::Counts);
    }
}
