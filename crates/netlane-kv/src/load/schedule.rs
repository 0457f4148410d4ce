//! When requests go out: one connection's send times.
//!
//! Open loop ([`Pacing::Open`]): every send time comes from the arrival process and the
//! seed alone, never from what the server did. A slow reply delays no later request;
//! a request the driver could not send on time is sent late and still measured from
//! its scheduled time. Times are absolute nanoseconds on the driver's clock, within
//! `[start_ns, end_ns)`, non-decreasing, and the schedule is finite (nothing at or after
//! `end_ns`). Gaps are accumulated in `f64` nanoseconds from the start (exact to well
//! under a nanosecond for runs of days), so no rounding drift builds up.
//!
//! Closed loop ([`Pacing::Closed`]): a fixed number of requests in flight; the next one
//! is due when a reply frees a slot. This is the classic benchmark loop, which lets a
//! slow server slow the offered load down (coordinated omission); it is here to show
//! that difference, not to measure with.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use super::rng::Rng;

/// The highest rate a schedule accepts: one request per nanosecond, the resolution of its
/// times.
pub const MAX_RATE_PER_S: f64 = 1e9;

/// The shape of ETC's inter-arrival gaps: a generalized Pareto with location 0, scale
/// 16.0292 µs and shape 0.154971 (Atikoglu et al., "Workload analysis of a large-scale
/// key-value store", SIGMETRICS 2012). The scale is replaced by the one that gives the
/// rate asked for, as mutilate's `GPareto::set_lambda` does (mutilate's own `fb_ia`
/// passes its parameters in the wrong order: see the workload module).
const ETC_GAP_SHAPE: f64 = 0.154971;

/// How send times are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// Exponential gaps: independent arrivals, what many independent users make.
    Poisson,
    /// Equal gaps, from a random phase per connection so connections do not fire together.
    Constant,
    /// ETC's generalized Pareto gaps: burstier than Poisson at the same mean.
    Etc,
}

impl FromStr for Process {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "poisson" => Ok(Process::Poisson),
            "constant" => Ok(Process::Constant),
            "etc" => Ok(Process::Etc),
            _ => Err(ScheduleError::Process(s.to_owned())),
        }
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Process::Poisson => "poisson",
            Process::Constant => "constant",
            Process::Etc => "etc",
        })
    }
}

/// An arrival process at a mean rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrivals {
    /// How gaps are drawn.
    pub process: Process,
    /// Mean requests per second.
    pub rate_per_s: f64,
}

impl Arrivals {
    /// Checks the rate: positive, finite, at most [`MAX_RATE_PER_S`].
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let r = self.rate_per_s;
        if r > 0.0 && r <= MAX_RATE_PER_S { Ok(()) } else { Err(ScheduleError::Rate(r)) }
    }

    /// One connection's share of this total rate over `connections` connections. For
    /// Poisson arrivals the connections' merged stream is again Poisson at the total
    /// rate; constant streams with independent phases merge into a jittered one.
    pub fn per_connection(&self, connections: u32) -> Result<Arrivals, ScheduleError> {
        self.validate()?;
        if connections == 0 {
            return Err(ScheduleError::NoConnections);
        }
        let share = Arrivals { process: self.process, rate_per_s: self.rate_per_s / f64::from(connections) };
        share.validate()?;
        Ok(share)
    }
}

/// Open or closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// Send times drawn in advance; latency is measured from them.
    Open(Arrivals),
    /// `depth` requests in flight, the next sent when one is answered; latency is
    /// measured from the actual send.
    Closed {
        /// Requests in flight.
        depth: u32,
    },
}

/// A schedule that cannot be built.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ScheduleError {
    /// The rate is not positive and finite, or above [`MAX_RATE_PER_S`].
    #[error("offered rate {0} requests/s: must be positive, finite and at most {MAX_RATE_PER_S:e}")]
    Rate(f64),
    /// A rate split over no connections.
    #[error("a rate cannot be split over zero connections")]
    NoConnections,
    /// A closed loop with nothing in flight.
    #[error("a closed loop needs at least one request in flight")]
    Depth,
    /// A connection allowed no request in flight.
    #[error("a connection needs room for at least one request in flight")]
    InFlight,
    /// The window ends before it starts.
    #[error("schedule ends at {end_ns} ns, before its start at {start_ns} ns")]
    Window {
        /// Start.
        start_ns: u64,
        /// End.
        end_ns: u64,
    },
    /// An arrival process name that is not one.
    #[error("unknown arrival process {0:?}: expected poisson, constant or etc")]
    Process(String),
}

#[derive(Debug, Clone)]
enum State {
    Open {
        process: Process,
        /// Mean gap, ns (infinite for rates too low to represent: no arrivals).
        gap_ns: f64,
        /// Offset of the pending arrival from the start, ns.
        next: f64,
        /// Constant arrivals: the pending arrival's index.
        index: u64,
        /// Constant arrivals: offset of the first one.
        phase: f64,
        rng: Rng,
    },
    Closed {
        /// Requests that may be sent now.
        free: u32,
        depth: u32,
        /// When the free slots became free.
        due_ns: u64,
    },
}

/// One connection's send times.
#[derive(Debug, Clone)]
pub struct Schedule {
    start_ns: u64,
    end_ns: u64,
    state: State,
}

impl Schedule {
    /// A schedule for `[start_ns, end_ns)`; `rng` draws the gaps (unused in closed loop).
    pub fn new(pacing: Pacing, start_ns: u64, end_ns: u64, rng: Rng) -> Result<Self, ScheduleError> {
        if end_ns < start_ns {
            return Err(ScheduleError::Window { start_ns, end_ns });
        }
        let state = match pacing {
            Pacing::Open(a) => {
                a.validate()?;
                let gap_ns = 1e9 / a.rate_per_s;
                let mut s = State::Open { process: a.process, gap_ns, next: 0.0, index: 0, phase: 0.0, rng };
                first_arrival(&mut s);
                s
            }
            Pacing::Closed { depth: 0 } => return Err(ScheduleError::Depth),
            Pacing::Closed { depth } => State::Closed { free: depth, depth, due_ns: start_ns },
        };
        Ok(Schedule { start_ns, end_ns, state })
    }

    /// Whether latency is measured from the scheduled time (open loop) rather than from
    /// the actual send (closed loop).
    pub fn is_open_loop(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// When the next request is due, or `None` when no more will be (the window is over,
    /// or a closed loop waits for a reply).
    pub fn next_due(&self) -> Option<u64> {
        match &self.state {
            State::Open { next, .. } => {
                // `next` is non-negative and below the span here, so the sum is below
                // `end_ns` and cannot overflow.
                (*next < (self.end_ns - self.start_ns) as f64).then(|| self.start_ns + *next as u64)
            }
            State::Closed { free, due_ns, .. } => (*free > 0 && *due_ns < self.end_ns).then_some(*due_ns),
        }
    }

    /// Takes the next request: its due time, the schedule moving on to the one after.
    pub fn take(&mut self) -> Option<u64> {
        let due = self.next_due()?;
        match &mut self.state {
            State::Open { .. } => advance(&mut self.state),
            State::Closed { free, .. } => *free -= 1,
        }
        Some(due)
    }

    /// A request was settled at `now_ns` (answered or given up): a closed loop may send
    /// the next one now.
    pub fn settled(&mut self, now_ns: u64) {
        if let State::Closed { free, depth, due_ns } = &mut self.state {
            *free = (*free + 1).min(*depth);
            *due_ns = (*due_ns).max(now_ns);
        }
    }

    /// Takes every request left in the window without sending it; returns how many (open
    /// loop: the requests that were offered but never went out; closed loop: none).
    pub fn drain(&mut self) -> u64 {
        if !self.is_open_loop() {
            return 0;
        }
        let mut n = 0;
        while self.take().is_some() {
            n += 1;
        }
        n
    }
}

/// Places an open schedule's first arrival.
fn first_arrival(state: &mut State) {
    let State::Open { process, gap_ns, next, phase, rng, .. } = state else { return };
    if !gap_ns.is_finite() {
        // A rate so low that its mean gap overflows: nothing ever arrives.
        *next = f64::INFINITY;
    } else if *process == Process::Constant {
        *phase = rng.unit() * *gap_ns;
        *next = *phase;
    } else {
        advance(state);
    }
}

/// Moves an open schedule from its pending arrival to the one after.
fn advance(state: &mut State) {
    let State::Open { process, gap_ns, next, index, phase, rng } = state else { return };
    match process {
        // From the index, not accumulated: exact spacing however long the run.
        Process::Constant => {
            *index += 1;
            *next = *phase + (*index as f64) * *gap_ns;
        }
        // Inverse CDF of the exponential; the open unit keeps the logarithm finite.
        Process::Poisson => *next += -rng.open_unit().ln() * *gap_ns,
        Process::Etc => {
            // Generalized Pareto, location 0, mean `gap_ns`: scale = (1 - shape) * mean.
            let k = ETC_GAP_SHAPE;
            let scale = (1.0 - k) * *gap_ns;
            *next += scale * (rng.open_unit().powf(-k) - 1.0) / k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(process: Process, rate_per_s: f64, start_ns: u64, end_ns: u64, seed: u64) -> Schedule {
        Schedule::new(Pacing::Open(Arrivals { process, rate_per_s }), start_ns, end_ns, Rng::new(seed)).unwrap()
    }

    fn times(s: &mut Schedule) -> Vec<u64> {
        std::iter::from_fn(|| s.take()).collect()
    }

    #[test]
    fn poisson_gaps_have_the_asked_mean_and_an_exponential_shape() {
        // 100k arrivals at 100k/s: the mean gap within 2% of 10 us.
        let mut s = open(Process::Poisson, 100_000.0, 5_000, u64::MAX, 1);
        let t: Vec<u64> = (0..100_001).map(|_| s.take().unwrap()).collect();
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        assert!(t[0] >= 5_000);
        let gaps: Vec<u64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<u64>() as f64 / gaps.len() as f64;
        assert!((mean / 10_000.0 - 1.0).abs() < 0.02, "mean gap {mean}");
        // P(gap > mean) = 1/e for an exponential.
        let over = gaps.iter().filter(|&&g| g as f64 > 10_000.0).count() as f64 / gaps.len() as f64;
        assert!((over - (-1f64).exp()).abs() < 0.01, "{over}");
    }

    #[test]
    fn poisson_counts_in_a_window_match_the_rate() {
        let mut s = open(Process::Poisson, 250_000.0, 0, 1_000_000_000, 9);
        let n = times(&mut s).len() as f64;
        // Standard deviation 500: 2% is 10 of them.
        assert!((n / 250_000.0 - 1.0).abs() < 0.02, "{n}");
    }

    #[test]
    fn constant_arrivals_are_exact() {
        let mut s = open(Process::Constant, 1000.0, 7, 7 + 1_000_000_000, 2);
        let t = times(&mut s);
        assert_eq!(t.len(), 1000);
        assert!(t[0] >= 7 && t[0] < 7 + 1_000_000);
        assert!(t.windows(2).all(|w| (999_999..=1_000_001).contains(&(w[1] - w[0]))));
        assert_eq!(t[999] - t[0], 999_000_000);
        // A rate that does not divide a second: still exactly 3 per second.
        let mut s = open(Process::Constant, 3.0, 0, 10_000_000_000, 3);
        assert_eq!(times(&mut s).len(), 30);
        // Connections get different phases.
        let a = open(Process::Constant, 1000.0, 0, 1_000_000_000, 1).next_due();
        let b = open(Process::Constant, 1000.0, 0, 1_000_000_000, 2).next_due();
        assert_ne!(a, b);
    }

    #[test]
    fn etc_gaps_have_the_asked_mean() {
        let mut s = open(Process::Etc, 50_000.0, 0, u64::MAX, 4);
        let t: Vec<u64> = (0..200_001).map(|_| s.take().unwrap()).collect();
        let mean = (t[200_000] - t[0]) as f64 / 200_000.0;
        assert!((mean / 20_000.0 - 1.0).abs() < 0.02, "mean gap {mean}");
    }

    #[test]
    fn extreme_rates_neither_overflow_nor_make_nan() {
        // One per nanosecond, at the very end of the clock.
        let mut s = open(Process::Constant, MAX_RATE_PER_S, u64::MAX - 1000, u64::MAX, 5);
        let t = times(&mut s);
        assert_eq!(t.len(), 1000);
        assert!(t.windows(2).all(|w| w[1] == w[0] + 1));
        let mut s = open(Process::Poisson, MAX_RATE_PER_S, u64::MAX - 100_000, u64::MAX, 5);
        let n = times(&mut s).len() as f64;
        assert!((n / 100_000.0 - 1.0).abs() < 0.02, "{n}");
        // Rates so low nothing arrives in a year, down to the smallest positive float.
        for rate in [1e-9, 1e-300, f64::MIN_POSITIVE, 5e-324] {
            for p in [Process::Poisson, Process::Constant, Process::Etc] {
                let mut s = open(p, rate, 0, 365 * 86_400 * 1_000_000_000, 6);
                assert_eq!(s.next_due(), None, "{p} at {rate}");
                assert_eq!(s.drain(), 0);
            }
        }
        // An empty window.
        assert_eq!(open(Process::Poisson, 1e6, 10, 10, 1).next_due(), None);
    }

    #[test]
    fn bad_rates_and_windows_are_refused() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 2e9] {
            let p = Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: rate });
            assert!(matches!(Schedule::new(p, 0, 1, Rng::new(0)), Err(ScheduleError::Rate(_))), "{rate}");
        }
        let p = Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: 1.0 });
        assert_eq!(Schedule::new(p, 2, 1, Rng::new(0)).unwrap_err(), ScheduleError::Window { start_ns: 2, end_ns: 1 });
        assert_eq!(Schedule::new(Pacing::Closed { depth: 0 }, 0, 1, Rng::new(0)).unwrap_err(), ScheduleError::Depth);
    }

    #[test]
    fn a_total_rate_splits_evenly() {
        let total = Arrivals { process: Process::Poisson, rate_per_s: 1e6 };
        assert_eq!(total.per_connection(8).unwrap().rate_per_s, 125_000.0);
        assert_eq!(total.per_connection(0), Err(ScheduleError::NoConnections));
        let bad = Arrivals { process: Process::Poisson, rate_per_s: -3.0 };
        assert_eq!(bad.per_connection(2), Err(ScheduleError::Rate(-3.0)));
        // 64 Poisson connections merge into the total rate.
        let share = total.per_connection(64).unwrap();
        let n: usize = (0..64)
            .map(|c| times(&mut Schedule::new(Pacing::Open(share), 0, 100_000_000, Rng::stream(1, c)).unwrap()).len())
            .sum();
        assert!((n as f64 / 100_000.0 - 1.0).abs() < 0.02, "{n}");
    }

    #[test]
    fn drain_counts_what_was_never_taken() {
        let mut s = open(Process::Constant, 1000.0, 0, 1_000_000_000, 8);
        for _ in 0..10 {
            s.take().unwrap();
        }
        assert_eq!(s.drain(), 990);
        assert_eq!(s.next_due(), None);
    }

    #[test]
    fn a_closed_loop_sends_when_a_reply_frees_a_slot() {
        let mut s = Schedule::new(Pacing::Closed { depth: 2 }, 100, 1_000, Rng::new(0)).unwrap();
        assert!(!s.is_open_loop());
        assert_eq!(s.take(), Some(100));
        assert_eq!(s.take(), Some(100));
        assert_eq!(s.next_due(), None);
        s.settled(250);
        assert_eq!(s.take(), Some(250));
        s.settled(1_000);
        assert_eq!(s.next_due(), None, "nothing at or after the end");
        assert_eq!(s.drain(), 0);
    }

    #[test]
    fn process_names_parse() {
        for p in [Process::Poisson, Process::Constant, Process::Etc] {
            assert_eq!(p.to_string().parse::<Process>().unwrap(), p);
        }
        let e = "posson".parse::<Process>().unwrap_err();
        assert_eq!(e.to_string(), "unknown arrival process \"posson\": expected poisson, constant or etc");
    }
}
