//! The pacing schedule (sans-IO).
//!
//! A paced sender releases data at a target rate on a small time scale, not just on
//! average: bursts of GSO trains overflow queues and cause loss. The kernel can pace
//! for us only with the fq qdisc (`SO_MAX_PACING_RATE`, connected sockets) or with
//! fq/etf and `SO_TXTIME` (per-packet release times). Without them the application
//! paces itself: it sleeps until a deadline, releases what is due, and repeats.
//!
//! The talk's open problem (LPC 2018, "Optimizing UDP for content delivery"): GSO wants
//! large batches, pacing wants small releases (a 1 MB/s client gets 1 KB per ms).
//! [`Pacer`] makes the trade-off explicit: releases happen every *quantum*, and each
//! release is a number of whole segments which the sender packs into as few GSO sends
//! as the limits allow. A wider quantum means fewer wake-ups and bigger GSO sends (less
//! CPU) but bigger bursts. [`Quantum::Auto`] favours CPU: it picks the smallest quantum
//! that holds a whole number of full GSO sends, at least [`AUTO_MIN_SENDS`] of them and
//! at least [`AUTO_MIN_QUANTUM_NS`] long. (Measured on a 2-vCPU VM over veth: each
//! wake-up costs about 8 us of sender CPU, including waking the receiver's NAPI thread;
//! with one 64 KB send per wake-up a paced sender spends 1.5-2x the CPU per byte of an
//! unpaced one, with four or more it spends about the same.)
//!
//! Deadlines are absolute (`start + k * quantum`), so oversleeping one release does not
//! shift the rest: the next release catches up, up to [`PaceConfig::max_catchup_ns`]
//! worth of data; anything beyond that after a long stall is forgiven (not sent) and
//! counted, so the achieved rate then reports the stall honestly.

use std::fmt;

use serde::Serialize;

/// Fewest full GSO sends per release [`Quantum::Auto`] chooses.
pub const AUTO_MIN_SENDS: u64 = 4;
/// Shortest quantum [`Quantum::Auto`] chooses: below this, wake-up cost dominates.
pub const AUTO_MIN_QUANTUM_NS: u64 = 1_000_000;
/// Longest quantum [`Quantum::Auto`] chooses, even if fewer sends then fit.
pub const AUTO_MAX_QUANTUM_NS: u64 = 50_000_000;
/// Default catch-up bound: a late release may send at most this much backlog.
pub const DEFAULT_MAX_CATCHUP_NS: u64 = 10_000_000;

/// How long each release period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Quantum {
    /// A fixed period in nanoseconds.
    Fixed(u64),
    /// Whole full GSO sends per period: at least [`AUTO_MIN_SENDS`] and
    /// [`AUTO_MIN_QUANTUM_NS`], at most [`AUTO_MAX_QUANTUM_NS`].
    Auto,
}

/// What to pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PaceConfig {
    /// Target rate in bytes of UDP payload per second.
    pub rate: u64,
    /// Release period.
    pub quantum: Quantum,
    /// Datagram (GSO segment) size in bytes.
    pub segment_size: usize,
    /// Segments per GSO send (1 without GSO).
    pub segments_per_send: usize,
    /// Most backlog, in nanoseconds of sending, one late release may catch up (at
    /// least one quantum).
    pub max_catchup_ns: u64,
}

/// A pacing configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaceError {
    /// Zero rate.
    #[error("pacing rate must be positive")]
    ZeroRate,
    /// Zero-length segments.
    #[error("segment size must be positive")]
    ZeroSegment,
    /// Zero quantum.
    #[error("pacing quantum must be positive")]
    ZeroQuantum,
    /// Less than one segment per second at this rate.
    #[error("rate {rate} B/s is below one {segment_size}-byte segment per second")]
    RateBelowOneSegment {
        /// The rate.
        rate: u64,
        /// The segment size.
        segment_size: usize,
    },
}

impl PaceConfig {
    /// A configuration with the defaults: automatic quantum, 10 ms catch-up.
    pub fn new(rate: u64, segment_size: usize, segments_per_send: usize) -> Self {
        Self {
            rate,
            quantum: Quantum::Auto,
            segment_size,
            segments_per_send: segments_per_send.max(1),
            max_catchup_ns: DEFAULT_MAX_CATCHUP_NS,
        }
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), PaceError> {
        if self.rate == 0 {
            return Err(PaceError::ZeroRate);
        }
        if self.segment_size == 0 {
            return Err(PaceError::ZeroSegment);
        }
        if self.quantum == Quantum::Fixed(0) {
            return Err(PaceError::ZeroQuantum);
        }
        if self.rate < self.segment_size as u64 {
            return Err(PaceError::RateBelowOneSegment { rate: self.rate, segment_size: self.segment_size });
        }
        Ok(())
    }

    /// Time in nanoseconds one full GSO send takes at the target rate.
    pub fn send_time_ns(&self) -> u64 {
        let bytes = (self.segment_size * self.segments_per_send.max(1)) as u128;
        ((bytes * 1_000_000_000).div_ceil(u128::from(self.rate.max(1)))) as u64
    }

    /// The release period in nanoseconds this configuration resolves to.
    pub fn quantum_ns(&self) -> u64 {
        match self.quantum {
            Quantum::Fixed(ns) => ns.max(1),
            Quantum::Auto => {
                let send = self.send_time_ns().max(1);
                let wanted = AUTO_MIN_SENDS.max(AUTO_MIN_QUANTUM_NS.div_ceil(send));
                let fit = AUTO_MAX_QUANTUM_NS / send;
                if fit == 0 {
                    // Not even one full send fits the longest quantum: release partial
                    // sends every AUTO_MAX_QUANTUM_NS.
                    AUTO_MAX_QUANTUM_NS
                } else {
                    send * wanted.min(fit)
                }
            }
        }
    }
}

/// One release: send `segments` datagrams now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// Segments to send.
    pub segments: u64,
    /// The deadline this release was scheduled for.
    pub deadline_ns: u64,
    /// How late the caller was (now - deadline), in nanoseconds.
    pub late_ns: u64,
}

/// What the pacer did: releases, segments released, catch-ups after stalls, and segments
/// forgiven.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PaceStats {
    /// Releases made.
    pub releases: u64,
    /// Segments released.
    pub segments: u64,
    /// Releases that caught up more than one quantum of backlog.
    pub catchups: u64,
    /// Segments dropped from the schedule after stalls longer than the catch-up limit.
    pub forgiven_segments: u64,
}

/// The pacing schedule: when to wake up and how many segments to release.
#[derive(Clone)]
pub struct Pacer {
    cfg: PaceConfig,
    quantum_ns: u64,
    start_ns: u64,
    next_ns: u64,
    /// Segments released or forgiven so far.
    accounted: u64,
    stats: PaceStats,
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("rate", &self.cfg.rate)
            .field("quantum_ns", &self.quantum_ns)
            .field("next_ns", &self.next_ns)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Pacer {
    /// A schedule starting at `start_ns` (any monotonic clock, in nanoseconds).
    pub fn new(cfg: PaceConfig, start_ns: u64) -> Result<Self, PaceError> {
        cfg.validate()?;
        Ok(Self {
            quantum_ns: cfg.quantum_ns(),
            cfg,
            start_ns,
            next_ns: start_ns,
            accounted: 0,
            stats: PaceStats::default(),
        })
    }

    /// The resolved release period.
    pub fn quantum_ns(&self) -> u64 {
        self.quantum_ns
    }

    /// The configuration.
    pub fn config(&self) -> &PaceConfig {
        &self.cfg
    }

    /// When the next release is due.
    pub fn next_deadline(&self) -> u64 {
        self.next_ns
    }

    /// Segments the schedule allows by time `t_ns` (whole segments, rounded down).
    pub fn credit(&self, t_ns: u64) -> u64 {
        let elapsed = u128::from(t_ns.saturating_sub(self.start_ns));
        let bytes = elapsed * u128::from(self.cfg.rate) / 1_000_000_000;
        (bytes / self.cfg.segment_size as u128) as u64
    }

    /// Makes the release due at or before `now_ns`: every segment owed up to the end of
    /// the current quantum, bounded by the catch-up limit. Returns zero segments if
    /// called before [`Pacer::next_deadline`].
    pub fn release(&mut self, now_ns: u64) -> Release {
        if now_ns < self.next_ns {
            return Release { segments: 0, deadline_ns: self.next_ns, late_ns: 0 };
        }
        let deadline_ns = self.next_ns;
        let k = (now_ns - self.start_ns) / self.quantum_ns;
        let period_end = self.start_ns + (k + 1) * self.quantum_ns;
        let owed = self.credit(period_end).saturating_sub(self.accounted);
        let per_quantum = self.credit(self.start_ns + self.quantum_ns).max(1);
        // The credit of any one window can exceed the first window's by one segment
        // (the fractional carry), hence the + 1.
        let window = self.quantum_ns.max(self.cfg.max_catchup_ns);
        let limit = self.credit(self.start_ns + window) + 1;
        let segments = owed.min(limit);
        if owed > per_quantum + 1 {
            self.stats.catchups += 1;
        }
        self.stats.forgiven_segments += owed - segments;
        self.accounted += owed;
        self.stats.releases += 1;
        self.stats.segments += segments;
        self.next_ns = period_end;
        Release { segments, deadline_ns, late_ns: now_ns - deadline_ns }
    }

    /// Counters.
    pub fn stats(&self) -> PaceStats {
        self.stats
    }
}

/// Splits a release of `segments` into GSO send sizes of at most `per_send` segments.
pub fn sends(segments: u64, per_send: usize) -> impl Iterator<Item = usize> {
    let per_send = per_send.max(1) as u64;
    let full = segments / per_send;
    let rest = segments % per_send;
    std::iter::repeat_n(per_send as usize, full as usize).chain((rest > 0).then_some(rest as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg(rate: u64, quantum: Quantum) -> PaceConfig {
        PaceConfig { quantum, ..PaceConfig::new(rate, 1400, 46) }
    }

    /// Drives a pacer with a perfect clock for `dur_ns`, returning segments released.
    fn run(p: &mut Pacer, start: u64, dur_ns: u64) -> u64 {
        let mut total = 0;
        while p.next_deadline() < start + dur_ns {
            let now = p.next_deadline();
            total += p.release(now).segments;
        }
        total
    }

    #[test]
    fn releases_exactly_the_rate_over_time() {
        for rate in [10_000_000u64, 100_000_000, 1_000_000_000, 1_234_567] {
            for q in [Quantum::Auto, Quantum::Fixed(MS / 4), Quantum::Fixed(MS), Quantum::Fixed(8 * MS)] {
                let start = 5 * MS;
                let mut p = Pacer::new(cfg(rate, q), start).unwrap();
                let dur = 2_000 * MS;
                let total = run(&mut p, start, dur);
                // Everything owed up to the end of the last quantum, to the segment.
                let last_end = p.next_deadline();
                assert_eq!(total, p.credit(last_end), "rate {rate} {q:?}");
                let bytes = total as f64 * 1400.0;
                let achieved = bytes / ((last_end - start) as f64 / 1e9);
                assert!((achieved / rate as f64 - 1.0).abs() < 0.001, "rate {rate} {q:?}: {achieved}");
                assert_eq!(p.stats().forgiven_segments, 0);
            }
        }
    }

    #[test]
    fn one_kilobyte_per_millisecond() {
        // The talk's example: 1 MB/s with a 1 ms quantum releases about 1 KB per ms.
        let mut p =
            Pacer::new(PaceConfig { quantum: Quantum::Fixed(MS), ..PaceConfig::new(1_000_000, 1000, 46) }, 0).unwrap();
        let per: Vec<u64> = (0..5)
            .map(|_| {
                let d = p.next_deadline();
                p.release(d).segments
            })
            .collect();
        assert_eq!(per, vec![1, 1, 1, 1, 1]);
    }

    #[test]
    fn auto_quantum_is_whole_gso_sends() {
        // 1 GB/s: one 46 x 1400 send takes 64.4 us; 16 of them reach 1 ms.
        let c = cfg(1_000_000_000, Quantum::Auto);
        assert_eq!(c.send_time_ns(), 64_400);
        assert_eq!(c.quantum_ns(), 16 * 64_400);
        let mut p = Pacer::new(c, 0).unwrap();
        assert_eq!(p.release(0).segments, 16 * 46);
        // 10 MB/s: one send per 6.44 ms, four per release.
        let c = cfg(10_000_000, Quantum::Auto);
        assert_eq!(c.quantum_ns(), 4 * 6_440_000);
        let mut p = Pacer::new(c, 0).unwrap();
        assert_eq!(p.release(0).segments, 4 * 46);
        // 2 MB/s: four sends would take 129 ms; as many whole sends as fit 50 ms.
        assert_eq!(cfg(2_000_000, Quantum::Auto).quantum_ns(), 32_200_000);
        // 100 kB/s: not even one send fits 50 ms; the cap applies.
        assert_eq!(cfg(100_000, Quantum::Auto).quantum_ns(), AUTO_MAX_QUANTUM_NS);
    }

    #[test]
    fn early_call_releases_nothing() {
        let mut p = Pacer::new(cfg(10_000_000, Quantum::Fixed(MS)), 100).unwrap();
        p.release(100);
        let r = p.release(150);
        assert_eq!(r.segments, 0);
        assert_eq!(p.stats().releases, 1);
    }

    #[test]
    fn late_wakeup_catches_up_without_shifting_the_schedule() {
        let mut p = Pacer::new(cfg(14_000_000, Quantum::Fixed(MS)), 0).unwrap();
        // 14 MB/s = 10 segments per ms.
        assert_eq!(p.release(0).segments, 10);
        // Wake 2.5 ms late for the 1 ms deadline: owes up to the end of quantum 3 (4 ms).
        let r = p.release(3_500_000);
        assert_eq!(r.segments, 30);
        assert_eq!(r.late_ns, 2_500_000);
        assert_eq!(p.next_deadline(), 4 * MS);
        assert_eq!(p.stats().catchups, 1);
    }

    #[test]
    fn long_stall_is_forgiven_and_counted() {
        let mut p = Pacer::new(cfg(14_000_000, Quantum::Fixed(MS)), 0).unwrap();
        p.release(0);
        let r = p.release(100 * MS);
        assert_eq!(r.segments, 101, "at most max_catchup_ns (10 ms) of backlog (+1 for rounding) at once");
        assert_eq!(p.stats().forgiven_segments, 1010 - 10 - 101);
        // Afterwards the schedule continues at the normal rate.
        let d = p.next_deadline();
        assert_eq!(p.release(d).segments, 10);
    }

    #[test]
    fn invalid_configurations() {
        assert_eq!(Pacer::new(cfg(0, Quantum::Auto), 0).unwrap_err(), PaceError::ZeroRate);
        assert_eq!(Pacer::new(cfg(1_000_000, Quantum::Fixed(0)), 0).unwrap_err(), PaceError::ZeroQuantum);
        let mut c = cfg(1_000_000, Quantum::Auto);
        c.segment_size = 0;
        assert_eq!(Pacer::new(c, 0).unwrap_err(), PaceError::ZeroSegment);
        assert!(matches!(Pacer::new(cfg(100, Quantum::Auto), 0).unwrap_err(), PaceError::RateBelowOneSegment { .. }));
    }

    #[test]
    fn sends_split_releases_into_gso_batches() {
        assert_eq!(sends(100, 46).collect::<Vec<_>>(), vec![46, 46, 8]);
        assert_eq!(sends(46, 46).collect::<Vec<_>>(), vec![46]);
        assert_eq!(sends(0, 46).count(), 0);
        assert_eq!(sends(3, 0).collect::<Vec<_>>(), vec![1, 1, 1]);
    }
}
