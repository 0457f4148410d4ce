//! A run's statistics as another process sends them: its counters and its latency
//! histogram in HdrHistogram's standard serialized form, checked before they are taken.

use base64::Engine as _;
use hdrhistogram::Histogram;
use thiserror::Error;

use super::{Counts, MAX_LATENCY_NS, Stats};

impl Stats {
    /// The latency histogram in HdrHistogram's standard serialized form (V2), base64:
    /// what another process merges exactly, and HdrHistogram's own tools read.
    pub fn latency_encoded(&self) -> String {
        let mut bytes = Vec::new();
        // Into a Vec, of a histogram within its own bounds: nothing can fail.
        use hdrhistogram::serialization::Serializer as _;
        let _ = hdrhistogram::serialization::V2Serializer::new().serialize(&self.latency, &mut bytes);
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// A run's statistics from its counters and its [`Stats::latency_encoded`]
    /// histogram, checked before anything is allocated: at most [`MAX_ENCODED`] bytes, a
    /// V2 histogram of this module's bounds (1 ns to 60 s, 3 digits) whose payload is
    /// what it says, and one latency per completed request.
    pub fn from_parts(counts: Counts, latency: &str) -> Result<Stats, WireError> {
        if latency.len() > MAX_ENCODED {
            return Err(WireError::TooLarge(latency.len()));
        }
        let bytes = base64::engine::general_purpose::STANDARD.decode(latency).map_err(|_| WireError::Base64)?;
        let field =
            |at: usize, n: usize| bytes.get(at..at + n).map(|b| b.iter().fold(0u64, |v, &x| v << 8 | u64::from(x)));
        let header = (field(0, 4), field(4, 4), field(12, 4), field(16, 8), field(24, 8));
        let (Some(V2_COOKIE), Some(payload), Some(3), Some(1), Some(MAX_LATENCY_NS)) = header else {
            return Err(WireError::NotOurs);
        };
        if bytes.len().checked_sub(V2_HEADER) != Some(payload as usize) {
            return Err(WireError::NotOurs);
        }
        let latency: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| WireError::Histogram(format!("{e:?}")))?;
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

/// The most base64 a [`Stats::from_parts`] histogram may have (a full 60 s range at 3
/// digits is tens of KiB).
pub const MAX_ENCODED: usize = 1 << 20;

/// More than any run counts of anything (a million requests a second for a day, over
/// a thousand times): counts past it are not a run's, and sums of them cannot overflow.
const MAX_REQUESTS: u64 = 1 << 47;

/// HdrHistogram's V2 cookie (0x1c849303, with the word size bits the Rust and Java
/// implementations set).
const V2_COOKIE: u64 = 0x1c84_9313;

/// A V2 histogram's header: cookie, payload length, normalizing offset, digits, lowest
/// and highest trackable values, integer-to-double ratio.
const V2_HEADER: usize = 40;

/// Statistics from another process that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Over [`MAX_ENCODED`].
    #[error("a histogram of {0} bytes: at most 1 MiB is taken")]
    TooLarge(usize),
    /// Not base64.
    #[error("the histogram is not base64")]
    Base64,
    /// Not a V2 histogram of 1 ns to 60 s at 3 digits.
    #[error("the histogram is not a V2 HdrHistogram of 1 ns to 60 s at 3 significant digits")]
    NotOurs,
    /// The payload did not decode.
    #[error("the histogram does not decode: {0}")]
    Histogram(String),
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
        assert_eq!(Stats::from_parts(*a.counts(), "not base64!").unwrap_err(), WireError::Base64);
        assert_eq!(
            Stats::from_parts(*a.counts(), &"A".repeat(MAX_ENCODED + 4)).unwrap_err(),
            WireError::TooLarge(MAX_ENCODED + 4)
        );
        let other = Histogram::<u64>::new_with_bounds(1, 1_000, 2).unwrap();
        let mut bytes = Vec::new();
        use hdrhistogram::serialization::Serializer as _;
        hdrhistogram::serialization::V2Serializer::new().serialize(&other, &mut bytes).unwrap();
        let other = base64::engine::general_purpose::STANDARD.encode(&bytes);
        assert_eq!(Stats::from_parts(Counts::default(), &other).unwrap_err(), WireError::NotOurs);
        // A header that claims more payload than it carries is refused before any allocation.
        let mut raw = base64::engine::general_purpose::STANDARD.decode(&encoded).unwrap();
        raw[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        let lying = base64::engine::general_purpose::STANDARD.encode(&raw);
        assert_eq!(Stats::from_parts(*a.counts(), &lying).unwrap_err(), WireError::NotOurs);
        let mut huge = *a.counts();
        huge.offered = u64::MAX;
        huge.not_sent = u64::MAX;
        assert_eq!(Stats::from_parts(huge, &encoded).unwrap_err(), WireError::Counts);
        raw.truncate(V2_HEADER - 1);
        let short = base64::engine::general_purpose::STANDARD.encode(&raw);
        assert_eq!(Stats::from_parts(*a.counts(), &short).unwrap_err(), WireError::NotOurs);
    }
}
