//! The rate search: the highest offered rate whose run meets the SLA, found by
//! bisection over short runs, the answer confirmed by running it again.
//!
//! A state machine without I/O: [`RateSearch::next_rate`] says what to run, the driver
//! runs it and hands back its [`Measurement`] through [`RateSearch::record`], until
//! `next_rate` is `None` and [`RateSearch::outcome`] has the answer. It keeps the curve
//! it walked.
//!
//! The rules:
//! - the lower bound is run first: when it misses, nothing in the range meets the SLA;
//! - then bisection, on a log scale (the bracket's geometric mean), between the highest
//!   rate that met and the lowest that missed (the upper bound until one misses), until
//!   the bracket's ratio is below the resolution or the bisection budget is spent;
//! - the best rate is then run again: when it meets again it is the answer; when it
//!   misses, it becomes the bracket's top and the search goes on below it from the
//!   highest rate under it that met. Every answer has met the SLA twice.
//! - A run meets only if the server kept up with it: one that completed under
//!   [`KEEP_UP`] of what it offered (the generator fell behind, or the server refused
//!   work) misses whatever its percentile says, and one that completed almost nothing
//!   ([`IDLE`]) is reported as idle. Either is a miss.
//! - A run in which the generator itself delayed more than [`GENERATOR_LAG_MAX`] of its
//!   sends (its CPU could not keep the schedule: [`Measurement::lag_share`]) measured the
//!   generator. It is a miss too, since nothing above it can be judged, and when such a
//!   run tops the final bracket the answer says so: the server may hold more than the
//!   generator can offer.

use thiserror::Error;

use super::stats::Measurement;

/// A run that completed less than this share of its offered rate fell behind.
pub const KEEP_UP: f64 = 0.9;
/// A run that completed less than this share of its offered rate did nothing.
pub const IDLE: f64 = 0.01;
/// Runs on one side that decide a rate (of at most five).
pub const MAJORITY: usize = 3;

/// How clearly a run went: its verdict and its percentile against the SLA's bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Vote {
    /// Whether it held the SLA (and kept up).
    pub held: bool,
    /// Its percentile over the SLA's bound (`None`: among failed requests, or it fell
    /// behind: as clear a miss as there is).
    pub ratio: Option<f64>,
}

impl Vote {
    /// Far from the bound: a hold at half of it or less, a miss at twice or more.
    fn clear(&self) -> bool {
        match (self.held, self.ratio) {
            (true, Some(r)) => r <= 0.5,
            (false, Some(r)) => r >= 2.0,
            (false, None) => true,
            (true, None) => false,
        }
    }
}

/// A rate's decision from its runs so far: `Some(true)` held, `Some(false)` missed,
/// `None` run again. Symmetric, since a server's own intermittent stalls must count
/// against it as much as the machine's may: the first side to three runs of five
/// decides, or two runs that agree and are both far from the bound (a hold at half of
/// it, a miss at twice it). A rate a server holds except when a stall hits the run (one
/// run in five, say) is decided missed once in 17 times (3 of 5), against once in 10
/// for a majority of three.
pub fn decided(votes: &[Vote]) -> Option<bool> {
    let held = votes.iter().filter(|v| v.held).count();
    let missed = votes.len() - held;
    if held >= MAJORITY {
        return Some(true);
    }
    if missed >= MAJORITY {
        return Some(false);
    }
    if let [a, b] = votes
        && a.held == b.held
        && a.clear()
        && b.clear()
    {
        return Some(a.held);
    }
    None
}

/// A run in which the generator delayed more than this share of its sends measured the
/// generator. (One that keeps up delays 0..1% here; one at its limit, 10..40%.)
pub const GENERATOR_LAG_MAX: f64 = 0.05;

/// The search's range and precision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchConfig {
    /// The lowest rate to try, requests/s.
    pub lo_per_s: f64,
    /// The highest, requests/s.
    pub hi_per_s: f64,
    /// Bisection stops when the bracket's top over its bottom is below this (1.05: 5%).
    pub resolution: f64,
    /// Most bisection runs (the first run and the confirmations come on top).
    pub max_bisections: u32,
}

/// A search that cannot run, or a result it did not ask for.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SearchError {
    /// Bounds that are not `0 < lo < hi`, finite.
    #[error("rate range {lo}..{hi} requests/s: must be positive, finite and increasing")]
    Bounds {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// A resolution that is not a finite ratio above 1.
    #[error("resolution {0}: must be a finite ratio above 1 (1.05, say)")]
    Resolution(f64),
    /// A result after the search ended.
    #[error("the search is over: no run was asked for")]
    Finished,
}

/// How a run went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Kept up and met the SLA.
    Met,
    /// Kept up, but missed the SLA.
    SlaMissed,
    /// Completed under [`KEEP_UP`] of the offered rate.
    FellBehind,
    /// Completed under [`IDLE`] of the offered rate: nothing happened.
    Idle,
    /// The generator delayed more than [`GENERATOR_LAG_MAX`] of its sends.
    GeneratorBound,
}

/// One run on the curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// The rate asked for, requests/s.
    pub rate_per_s: f64,
    /// What the run measured.
    pub measured: Measurement,
    /// How it went.
    pub verdict: Verdict,
    /// Whether it re-ran a rate that had met, to confirm it.
    pub confirmation: bool,
}

/// The search's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// The highest rate that met the SLA twice, with its confirming run.
    Found {
        /// The confirming run.
        point: Point,
        /// No rate missed: the capacity may lie above the upper bound.
        capped: bool,
        /// The lowest rate that missed did so because the generator could not keep its
        /// schedule: the server may hold more than this.
        generator_limited: bool,
    },
    /// Not even the lowest rate met the SLA (twice).
    NoneMet,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Running the lower bound.
    Floor,
    /// Running the bracket's middle.
    Bisect,
    /// Running the best rate again.
    Confirm,
    Done(Outcome),
}

/// The search.
#[derive(Debug, Clone)]
pub struct RateSearch {
    cfg: SearchConfig,
    phase: Phase,
    /// Rates that met once and were not refuted, ascending: the last is the bracket's
    /// bottom.
    met: Vec<f64>,
    /// The bracket's top: the lowest rate that missed, or the upper bound.
    hi: f64,
    missed: bool,
    /// The bracket's top came from a run the generator could not keep up with.
    hi_by_generator: bool,
    bisections: u32,
    curve: Vec<Point>,
}

impl RateSearch {
    /// A search over `cfg`'s range.
    pub fn new(cfg: SearchConfig) -> Result<Self, SearchError> {
        let SearchConfig { lo_per_s: lo, hi_per_s: hi, resolution, .. } = cfg;
        if !(lo > 0.0 && lo < hi && hi.is_finite()) {
            return Err(SearchError::Bounds { lo, hi });
        }
        if !(resolution > 1.0 && resolution.is_finite()) {
            return Err(SearchError::Resolution(resolution));
        }
        Ok(RateSearch {
            cfg,
            phase: Phase::Floor,
            met: Vec::new(),
            hi,
            missed: false,
            hi_by_generator: false,
            bisections: 0,
            curve: Vec::new(),
        })
    }

    /// The rate to run next, requests/s, or `None` when the search is over.
    pub fn next_rate(&self) -> Option<f64> {
        let lo = self.met.last().copied();
        match self.phase {
            Phase::Floor => Some(self.cfg.lo_per_s),
            Phase::Bisect => lo.map(|lo| (lo * self.hi).sqrt()),
            Phase::Confirm => lo,
            Phase::Done(_) => None,
        }
    }

    /// Takes the result of running [`RateSearch::next_rate`]; returns it as a point of the
    /// curve.
    pub fn record(&mut self, measured: Measurement) -> Result<Point, SearchError> {
        let rate = self.next_rate().ok_or(SearchError::Finished)?;
        let verdict = judge(rate, &measured);
        let met = verdict == Verdict::Met;
        let point = Point { rate_per_s: rate, measured, verdict, confirmation: self.phase == Phase::Confirm };
        self.curve.push(point);
        match self.phase {
            Phase::Floor | Phase::Bisect => {
                if self.phase == Phase::Bisect {
                    self.bisections += 1;
                }
                if met {
                    self.met.push(rate);
                } else {
                    self.missed_at(rate, verdict);
                }
            }
            Phase::Confirm if met => {
                self.phase = Phase::Done(Outcome::Found {
                    point,
                    capped: !self.missed,
                    generator_limited: self.hi_by_generator,
                });
                return Ok(point);
            }
            Phase::Confirm => self.missed_at(rate, verdict),
            Phase::Done(_) => return Err(SearchError::Finished),
        }
        self.phase = match self.met.last() {
            None => Phase::Done(Outcome::NoneMet),
            Some(lo) if self.hi / lo < self.cfg.resolution || self.bisections >= self.cfg.max_bisections => {
                Phase::Confirm
            }
            Some(_) => Phase::Bisect,
        };
        Ok(point)
    }

    /// The runs so far, in order.
    pub fn curve(&self) -> &[Point] {
        &self.curve
    }

    /// The answer, once the search is over.
    pub fn outcome(&self) -> Option<Outcome> {
        match self.phase {
            Phase::Done(o) => Some(o),
            _ => None,
        }
    }

    /// `rate` missed: it tops the bracket, and no rate at or above it is a candidate.
    fn missed_at(&mut self, rate: f64, verdict: Verdict) {
        if !self.missed || rate < self.hi {
            self.hi = rate;
            self.hi_by_generator = verdict == Verdict::GeneratorBound;
        }
        self.missed = true;
        self.met.retain(|&r| r < rate);
    }
}

/// How many standard deviations of a Poisson count over the window the offered rate may
/// fall below the rate asked for by chance alone. A schedule of constant gaps offers its
/// count exactly (the allowance then only hides a run a little short); the ETC
/// schedule's count varies about 1.45x as much as a Poisson one's: over three of its own.
pub const ARRIVAL_SIGMAS: f64 = 4.0;

/// Whether a run at `rate` kept up and met the SLA. The run is judged against the higher
/// of what it actually offered and the lowest rate a random schedule at `rate` offers by
/// chance over the window ([`ARRIVAL_SIGMAS`] below it): a run cut short does not look
/// better, and a short run whose arrivals happened to be few is not called behind (at 500/s
/// over 200 ms, one run in seven offers under 90% of the rate).
pub fn judge(rate: f64, m: &Measurement) -> Verdict {
    let window_s = m.window_ns as f64 / 1e9;
    let by_chance = if window_s > 0.0 { ARRIVAL_SIGMAS * (rate / window_s).sqrt() } else { 0.0 };
    // f64::max ignores a NaN offered rate; a NaN achieved rate counts as nothing done.
    let offered = m.offered_per_s.max(rate - by_chance);
    let achieved = if m.achieved_per_s.is_nan() { 0.0 } else { m.achieved_per_s };
    // A rate so low that chance allows nothing offered still did nothing when nothing
    // completed.
    if achieved <= 0.0 || achieved < IDLE * offered {
        Verdict::Idle
    } else if m.lag_share > GENERATOR_LAG_MAX {
        Verdict::GeneratorBound
    } else if achieved < KEEP_UP * offered {
        Verdict::FellBehind
    } else if m.sla_met {
        Verdict::Met
    } else {
        Verdict::SlaMissed
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const SLA_NS: u64 = 1_000_000;

    /// A server of capacity `capacity_per_s` whose p99.9 at rate r is
    /// `base_ns / (1 - r / capacity)`: it crosses the SLA at capacity * (1 - base / SLA).
    fn server(capacity_per_s: f64, base_ns: f64) -> impl Fn(f64) -> Measurement {
        move |rate| {
            let achieved = rate.min(capacity_per_s);
            let p999 = (rate < capacity_per_s).then(|| (base_ns / (1.0 - rate / capacity_per_s)) as u64);
            Measurement {
                offered_per_s: rate,
                achieved_per_s: achieved,
                sla_latency_ns: p999,
                sla_met: p999.is_some_and(|ns| ns <= SLA_NS),
                lag_share: 0.0,
                window_ns: 1_000_000_000,
            }
        }
    }

    fn cfg() -> SearchConfig {
        SearchConfig { lo_per_s: 1_000.0, hi_per_s: 1_000_000.0, resolution: 1.02, max_bisections: 40 }
    }

    fn run(search: &mut RateSearch, server: impl Fn(f64) -> Measurement) -> Outcome {
        while let Some(rate) = search.next_rate() {
            search.record(server(rate)).unwrap();
            assert!(search.curve().len() < 100, "the search must end");
        }
        search.outcome().unwrap()
    }

    #[test]
    fn the_search_converges_on_the_rate_where_the_tail_crosses_the_sla() {
        // Capacity 100k/s, 50 us unloaded: p99.9 reaches 1 ms at 95,000/s.
        let crossing = 95_000.0;
        let mut s = RateSearch::new(cfg()).unwrap();
        let Outcome::Found { point, capped, .. } = run(&mut s, server(100_000.0, 50_000.0)) else { panic!("none met") };
        assert!(!capped);
        assert!(point.confirmation && point.verdict == Verdict::Met);
        assert!(point.rate_per_s <= crossing && point.rate_per_s >= crossing / 1.02, "{}", point.rate_per_s);
        // The curve: the first run is the floor, every rate above the crossing missed,
        // every one below met, and the answer was run twice.
        let curve = s.curve();
        assert_eq!(curve[0].rate_per_s, 1_000.0);
        for p in curve {
            assert_eq!(p.verdict == Verdict::Met, p.rate_per_s <= crossing, "{p:?}");
        }
        assert_eq!(curve.iter().filter(|p| p.rate_per_s == point.rate_per_s).count(), 2);
        assert!(curve.len() < 20, "{} runs", curve.len());
        // Past capacity the runs fell behind rather than just missing.
        assert!(curve.iter().any(|p| p.verdict == Verdict::FellBehind));
        assert_eq!(s.record(server(100_000.0, 50_000.0)(1.0)), Err(SearchError::Finished));
    }

    #[test]
    fn a_failed_confirmation_sends_the_search_below_it() {
        // Rates in (80k, 95k] meet the first time and miss the second (a server whose
        // tail gets worse as it runs, say); the answer must be at most 80k.
        let runs = std::cell::RefCell::new(HashMap::<u64, u32>::new());
        let flaky = |rate: f64| {
            let mut m = server(100_000.0, 50_000.0)(rate);
            let seen = *runs.borrow_mut().entry(rate.to_bits()).and_modify(|n| *n += 1).or_insert(1);
            if rate > 80_000.0 && seen > 1 {
                m.sla_met = false;
            }
            m
        };
        let mut s = RateSearch::new(cfg()).unwrap();
        let Outcome::Found { point, .. } = run(&mut s, flaky) else { panic!("none met") };
        assert!(point.rate_per_s <= 80_000.0 && point.rate_per_s >= 80_000.0 / 1.02, "{}", point.rate_per_s);
        let failed_confirmations = s.curve().iter().filter(|p| p.confirmation && p.verdict != Verdict::Met).count();
        assert!(failed_confirmations >= 1);
    }

    #[test]
    fn a_run_that_did_nothing_is_refused() {
        // A server that refused every connection: nothing completed, no latency.
        let dead = |rate: f64| Measurement {
            offered_per_s: rate,
            achieved_per_s: 0.0,
            sla_latency_ns: None,
            sla_met: false,
            lag_share: 0.0,
            window_ns: 1_000_000_000,
        };
        let mut s = RateSearch::new(cfg()).unwrap();
        assert_eq!(run(&mut s, dead), Outcome::NoneMet);
        assert_eq!(s.curve().len(), 1);
        assert_eq!(s.curve()[0].verdict, Verdict::Idle);
        // Even a run claiming to meet the SLA is refused when it did no work, or a
        // fraction of it, or when it offered far less than it was asked to.
        let m = |offered: f64, achieved: f64| Measurement {
            offered_per_s: offered,
            achieved_per_s: achieved,
            sla_latency_ns: Some(1),
            sla_met: true,
            lag_share: 0.0,
            window_ns: 1_000_000_000,
        };
        assert_eq!(judge(1000.0, &m(1000.0, 0.0)), Verdict::Idle);
        assert_eq!(judge(1000.0, &m(1000.0, 5.0)), Verdict::Idle);
        assert_eq!(judge(1000.0, &m(1000.0, f64::NAN)), Verdict::Idle);
        assert_eq!(judge(1000.0, &m(1000.0, 850.0)), Verdict::FellBehind);
        assert_eq!(judge(1000.0, &m(100.0, 100.0)), Verdict::FellBehind, "a run cut short");
        assert_eq!(judge(1000.0, &m(970.0, 960.0)), Verdict::Met, "arrival noise is allowed for");
        assert_eq!(judge(1000.0, &m(1100.0, 950.0)), Verdict::FellBehind, "judged against what was offered");
        // A short run's Poisson count: 500/s over 200 ms offers 100 requests on average,
        // under 90 in one run of seven. All answered is keeping up; a quarter short is not.
        let short = |offered: f64| Measurement { window_ns: 200_000_000, ..m(offered, offered) };
        assert_eq!(judge(500.0, &short(435.0)), Verdict::Met, "few arrivals by chance");
        assert_eq!(judge(500.0, &short(250.0)), Verdict::FellBehind, "more than chance explains");
        // At 10/s over a second chance allows even nothing offered: nothing done is idle.
        assert_eq!(judge(10.0, &m(0.0, 0.0)), Verdict::Idle);
        // An idle run mid-search counts as a miss, and the search goes on below it.
        let mut s = RateSearch::new(cfg()).unwrap();
        let dies_above_10k = |rate: f64| if rate > 10_000.0 { dead(rate) } else { server(100_000.0, 50_000.0)(rate) };
        let Outcome::Found { point, .. } = run(&mut s, dies_above_10k) else { panic!("none met") };
        assert!(point.rate_per_s <= 10_000.0 && point.rate_per_s >= 10_000.0 / 1.02);
    }

    #[test]
    fn a_generator_that_cannot_keep_its_schedule_bounds_the_answer_and_says_so() {
        // The server holds 95k/s; the generator lags on 20% of its sends above 60k/s.
        let generator = |rate: f64| {
            let mut m = server(100_000.0, 50_000.0)(rate);
            if rate > 60_000.0 {
                m.lag_share = 0.2;
            }
            m
        };
        let mut s = RateSearch::new(cfg()).unwrap();
        let Outcome::Found { point, capped, generator_limited } = run(&mut s, generator) else { panic!("none met") };
        assert!(generator_limited && !capped);
        assert!(point.rate_per_s <= 60_000.0 && point.rate_per_s >= 60_000.0 / 1.02, "{}", point.rate_per_s);
        assert!(s.curve().iter().any(|p| p.verdict == Verdict::GeneratorBound));
        // Lagging sends decide before the percentile: a run that met its SLA while the
        // generator lagged measured nothing about the server.
        let mut m = server(100_000.0, 50_000.0)(1000.0);
        m.lag_share = 0.06;
        assert_eq!(judge(1000.0, &m), Verdict::GeneratorBound);
        m.lag_share = 0.04;
        assert_eq!(judge(1000.0, &m), Verdict::Met);
        // When the server's own miss sets the top, the answer is the server's.
        let mut s = RateSearch::new(cfg()).unwrap();
        let Outcome::Found { generator_limited, .. } = run(&mut s, server(100_000.0, 50_000.0)) else {
            panic!("none met")
        };
        assert!(!generator_limited);
    }

    #[test]
    fn three_of_five_or_two_clear_agreeing_runs_decide_a_rate() {
        let v = |held, ratio| Vote { held, ratio };
        assert_eq!(decided(&[]), None);
        assert_eq!(decided(&[v(true, Some(0.2))]), None);
        assert_eq!(decided(&[v(true, Some(0.2)), v(true, Some(0.4))]), Some(true), "two clear holds");
        assert_eq!(decided(&[v(true, Some(0.2)), v(true, Some(0.9))]), None, "one close to the bound");
        assert_eq!(decided(&[v(false, Some(3.0)), v(false, None)]), Some(false), "two clear misses");
        assert_eq!(decided(&[v(false, Some(1.2)), v(false, Some(1.1))]), None, "two close misses may be two stalls");
        let three = [v(true, Some(0.9)), v(false, Some(1.1)), v(true, Some(0.9)), v(true, Some(0.8))];
        assert_eq!(decided(&three), Some(true));
        let three = [v(false, Some(1.1)), v(true, Some(0.9)), v(false, Some(1.2)), v(false, Some(1.3))];
        assert_eq!(decided(&three), Some(false));
        // Symmetric: swapping every vote swaps the decision.
        let swap = |vs: &[Vote]| vs.iter().map(|x| Vote { held: !x.held, ..*x }).collect::<Vec<_>>();
        assert_eq!(decided(&swap(&three)), Some(true));
        // No sequence needs more than five runs.
        for seq in 0u32..32 {
            let mut votes = Vec::new();
            for i in 0..5 {
                if decided(&votes).is_some() {
                    break;
                }
                votes.push(v(seq >> i & 1 == 1, Some(1.0)));
            }
            assert!(decided(&votes).is_some() && votes.len() <= 5, "{seq:05b}");
        }
    }

    #[test]
    fn a_range_the_server_beats_says_so() {
        let mut s = RateSearch::new(SearchConfig { hi_per_s: 50_000.0, ..cfg() }).unwrap();
        let Outcome::Found { point, capped, .. } = run(&mut s, server(100_000.0, 50_000.0)) else { panic!("none met") };
        assert!(capped);
        assert!(point.rate_per_s >= 50_000.0 / 1.02);
    }

    #[test]
    fn the_budget_bounds_the_runs() {
        let mut s = RateSearch::new(SearchConfig { max_bisections: 3, ..cfg() }).unwrap();
        let Outcome::Found { point, .. } = run(&mut s, server(100_000.0, 50_000.0)) else { panic!("none met") };
        // Floor, three bisections, one confirmation.
        assert_eq!(s.curve().len(), 5);
        assert!(point.rate_per_s <= 95_000.0);
        // No bisection at all: the floor, confirmed.
        let mut s = RateSearch::new(SearchConfig { max_bisections: 0, ..cfg() }).unwrap();
        let Outcome::Found { point, .. } = run(&mut s, server(100_000.0, 50_000.0)) else { panic!("none met") };
        assert_eq!((point.rate_per_s, s.curve().len()), (1_000.0, 2));
    }

    #[test]
    fn bad_ranges_are_refused() {
        let bad = |f: fn(&mut SearchConfig)| {
            let mut c = cfg();
            f(&mut c);
            RateSearch::new(c).unwrap_err()
        };
        assert!(matches!(bad(|c| c.lo_per_s = 0.0), SearchError::Bounds { .. }));
        assert!(matches!(bad(|c| c.hi_per_s = 500.0), SearchError::Bounds { .. }));
        assert!(matches!(bad(|c| c.hi_per_s = f64::INFINITY), SearchError::Bounds { .. }));
        assert!(matches!(bad(|c| c.lo_per_s = f64::NAN), SearchError::Bounds { .. }));
        assert_eq!(bad(|c| c.resolution = 1.0), SearchError::Resolution(1.0));
        assert!(matches!(bad(|c| c.resolution = f64::NAN), SearchError::Resolution(_)));
    }
}
