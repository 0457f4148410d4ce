//! Target checks that cannot pass on nothing.
//!
//! A check compares one sample per pair of runs (the two sides of a ratio measured in
//! the same round) or per run with its target:
//!
//! - every sample meets it: **met**;
//! - none does: **missed**;
//! - some do and some do not (the target lies inside the samples' range): **within
//!   noise**;
//! - any input was degenerate (zero bytes, operations or CPU time, NaN, an empty
//!   histogram, an impossible run), or there were no samples: **invalid**, with the
//!   reason. Invalid counts as missed, never as met.
//!
//! Quantities that can be undefined are [`Measure`]s: a value, or the reason there is
//! none. The helpers here ([`ratio`], [`per_gb`], [`positive`]) refuse the inputs that
//! used to turn into a harmless-looking 0.

use crate::stats::median;
use netlane_report::{Check, Measured, Op, Outcome, Target};

/// A measured quantity, or why there is none.
pub type Measure = Result<f64, String>;

/// The median a check measured, as its headline prints it (None: not measured).
pub fn measured_median(checks: &[Check], id: &str) -> Option<String> {
    checks.iter().find(|c| c.id == id).and_then(|c| c.measured.as_ref()).map(|m| crate::stats::sig(m.median))
}

/// The median a check measured and its target as the report prints it (`<= 1 x`), for
/// a headline that says what it is held to.
pub fn measured_and_target(checks: &[Check], id: &str) -> Option<(String, String)> {
    let c = checks.iter().find(|c| c.id == id)?;
    let m = c.measured.as_ref()?;
    Some((crate::stats::sig(m.median), netlane_report::format::target(&c.target)))
}

/// A headline from phrases: joined with "; ", capitalised, ending in a period (None
/// when there are none).
pub fn join_headline(parts: Vec<String>) -> Option<String> {
    let s = parts.join("; ");
    let mut chars = s.chars();
    let first = chars.next()?;
    Some(format!("{}{}.", first.to_uppercase(), chars.as_str()))
}

/// `v` if it is finite and above zero, else why not (`what` names it).
pub fn positive(v: f64, what: &str) -> Measure {
    if !v.is_finite() {
        Err(format!("{what} is not a number"))
    } else if v <= 0.0 {
        Err(format!("{what} is {v}"))
    } else {
        Ok(v)
    }
}

/// `v` if it is finite and not negative (zero is a real measurement: no loss).
pub fn finite(v: f64, what: &str) -> Measure {
    if !v.is_finite() {
        Err(format!("{what} is not a number"))
    } else if v < 0.0 {
        Err(format!("{what} is negative ({v})"))
    } else {
        Ok(v)
    }
}

/// `num / den`; degenerate when either is, or when the denominator is zero.
pub fn ratio(num: Measure, den: Measure) -> Measure {
    let (n, d) = (num?, den?);
    if !(n.is_finite() && d.is_finite()) {
        return Err("a side of the ratio is not a number".into());
    }
    if d == 0.0 {
        return Err("the ratio's denominator is 0".into());
    }
    Ok(n / d)
}

/// CPU seconds per GB (10^9 bytes): degenerate when nothing moved or no CPU time was
/// measured.
pub fn per_gb(cpu_s: f64, bytes: u64, who: &str) -> Measure {
    if bytes == 0 {
        return Err(format!("{who} moved 0 bytes"));
    }
    if !(cpu_s.is_finite() && cpu_s > 0.0) {
        return Err(format!("{who}: no CPU time was measured"));
    }
    Ok(cpu_s / (bytes as f64 / 1e9))
}

/// `count / seconds`: degenerate when nothing happened or no time passed.
pub fn rate(count: f64, seconds: f64, what: &str) -> Measure {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("{what}: no time was measured"));
    }
    positive(count, what).map(|c| c / seconds)
}

/// The samples of paired runs: `f(a[i]) / f(b[i])` for each round both sides ran.
pub fn paired<T>(a: &[T], b: &[T], f: impl Fn(&T) -> Measure) -> Vec<Measure> {
    a.iter().zip(b).map(|(x, y)| ratio(f(x), f(y))).collect()
}

/// A target check, before it is measured.
#[derive(Debug, Clone)]
pub struct Spec {
    id: String,
    name: String,
    target: Target,
}

impl Spec {
    fn new(id: &str, name: impl Into<String>, op: Op, value: f64, upper: Option<f64>, unit: &str) -> Spec {
        Spec { id: id.into(), name: name.into(), target: Target { op, value, upper, unit: unit.into() } }
    }

    /// value <= `max`.
    pub fn at_most(id: &str, name: impl Into<String>, max: f64, unit: &str) -> Spec {
        Spec::new(id, name, Op::AtMost, max, None, unit)
    }

    /// value >= `min`.
    pub fn at_least(id: &str, name: impl Into<String>, min: f64, unit: &str) -> Spec {
        Spec::new(id, name, Op::AtLeast, min, None, unit)
    }

    /// value < `bound`.
    pub fn below(id: &str, name: impl Into<String>, bound: f64, unit: &str) -> Spec {
        Spec::new(id, name, Op::Below, bound, None, unit)
    }

    /// value > `bound`.
    pub fn above(id: &str, name: impl Into<String>, bound: f64, unit: &str) -> Spec {
        Spec::new(id, name, Op::Above, bound, None, unit)
    }

    /// `lo` <= value <= `hi`.
    pub fn within(id: &str, name: impl Into<String>, lo: f64, hi: f64, unit: &str) -> Spec {
        Spec::new(id, name, Op::Within, lo, Some(hi), unit)
    }

    /// Whether `v` meets the target.
    fn meets(&self, v: f64) -> bool {
        let t = &self.target;
        match t.op {
            Op::Below => v < t.value,
            Op::AtMost => v <= t.value,
            Op::Above => v > t.value,
            Op::AtLeast => v >= t.value,
            Op::Within => v >= t.value && v <= t.upper.unwrap_or(f64::INFINITY),
        }
    }

    /// The check, from `samples` (one per pair or run); `how` says how they were
    /// formed, for the reader.
    pub fn evaluate(&self, samples: Vec<Measure>, how: &str) -> Check {
        let several = samples.len() > 1;
        let mut problems: Vec<String> = Vec::new();
        let mut values = Vec::with_capacity(samples.len());
        for (i, s) in samples.into_iter().enumerate() {
            match s {
                Ok(v) if v.is_finite() => values.push(v),
                Ok(_) => problems.push(if several {
                    format!("sample {}: not a number", i + 1)
                } else {
                    "not a number".into()
                }),
                Err(e) => problems.push(if several { format!("sample {}: {e}", i + 1) } else { e }),
            }
        }
        if values.is_empty() && problems.is_empty() {
            problems.push("nothing was measured".into());
        }
        if !problems.is_empty() {
            return self.finish(None, Outcome::Invalid, problems.join("; "));
        }
        let meeting = values.iter().filter(|v| self.meets(**v)).count();
        let outcome = if meeting == values.len() {
            Outcome::Met
        } else if meeting == 0 {
            Outcome::Missed
        } else {
            Outcome::WithinNoise
        };
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let measured = Measured { median: median(values.clone()), min, max, samples: values };
        self.finish(Some(measured), outcome, how.to_string())
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The check when it is invalid before measuring (an impossible run, say).
    pub fn invalid(&self, why: impl Into<String>) -> Check {
        self.finish(None, Outcome::Invalid, why.into())
    }

    /// The check when a mode it needs did not run.
    pub fn skipped(&self, why: impl Into<String>) -> Check {
        self.finish(None, Outcome::Skipped, why.into())
    }

    /// Not shown on this machine: it needs `needs` CPUs and has `has`; `plan` is where
    /// the roles ran instead.
    pub fn not_shown(&self, needs: usize, has: usize, what: &str, plan: &str) -> Check {
        self.finish(
            None,
            Outcome::NotShown,
            format!("needs {needs} CPUs ({what}), this machine gives {has}; the plan: {plan}"),
        )
    }

    /// Not shown on this machine for want of a device or kernel feature: `needs` says
    /// what would show it, `found` what was measured here instead.
    pub fn not_shown_for(&self, needs: &str, found: &str) -> Check {
        self.finish(None, Outcome::NotShown, format!("needs {needs}; here {found}"))
    }

    fn finish(&self, measured: Option<Measured>, outcome: Outcome, reason: String) -> Check {
        Check { id: self.id.clone(), name: self.name.clone(), target: self.target.clone(), measured, outcome, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(max: f64) -> Spec {
        Spec::at_most("t.le", "lower is better", max, "x")
    }

    #[test]
    fn all_pairs_meeting_is_met_none_is_missed_some_is_within_noise() {
        assert_eq!(le(1.0).evaluate(vec![Ok(0.5), Ok(0.7), Ok(0.9)], "pairs").outcome, Outcome::Met);
        assert_eq!(le(1.0).evaluate(vec![Ok(1.5), Ok(1.7)], "pairs").outcome, Outcome::Missed);
        let c = le(1.0).evaluate(vec![Ok(0.9), Ok(1.1), Ok(1.0)], "pairs");
        assert_eq!(c.outcome, Outcome::WithinNoise);
        let m = c.measured.unwrap();
        assert_eq!((m.median, m.min, m.max), (1.0, 0.9, 1.1));
        let within = Spec::within("t.w", "rate", 0.98, 1.02, "x");
        assert_eq!(within.evaluate(vec![Ok(0.99), Ok(1.01)], "runs").outcome, Outcome::Met);
        assert_eq!(within.evaluate(vec![Ok(0.97), Ok(1.01)], "runs").outcome, Outcome::WithinNoise);
        assert_eq!(Spec::below("t.b", "b", 1.0, "x").evaluate(vec![Ok(1.0)], "").outcome, Outcome::Missed);
        assert_eq!(Spec::above("t.a", "a", 0.0, "pp").evaluate(vec![Ok(0.1)], "").outcome, Outcome::Met);
    }

    #[test]
    fn a_lower_is_better_check_cannot_pass_on_a_mode_that_moved_nothing() {
        // The old per_gb() returned 0 for 0 bytes, and 0 <= 0.25 passed.
        let idle = per_gb(0.0, 0, "gso sender");
        let busy = per_gb(1.2, 1_000_000_000, "udp sender");
        let c = le(0.25).evaluate(vec![ratio(idle, busy)], "gso / udp");
        assert_eq!(c.outcome, Outcome::Invalid);
        assert!(c.reason.contains("moved 0 bytes"), "{}", c.reason);
        assert!(c.outcome.fails_strict());
    }

    #[test]
    fn a_zero_denominator_is_invalid_not_zero() {
        let c = le(0.25).evaluate(vec![ratio(Ok(1.0), Ok(0.0))], "");
        assert_eq!(c.outcome, Outcome::Invalid);
        assert!(c.reason.contains("denominator is 0"), "{}", c.reason);
    }

    #[test]
    fn no_cpu_time_is_invalid() {
        assert!(per_gb(0.0, 1_000_000, "sender").unwrap_err().contains("no CPU time"));
        let c = le(2.0).evaluate(vec![ratio(rate(1e6, 0.0, "NAPI thread"), Ok(1.0))], "");
        assert_eq!(c.outcome, Outcome::Invalid);
    }

    #[test]
    fn nan_and_empty_inputs_are_invalid() {
        assert_eq!(le(1.0).evaluate(vec![Ok(f64::NAN)], "").outcome, Outcome::Invalid);
        assert_eq!(le(1.0).evaluate(vec![], "").outcome, Outcome::Invalid);
        assert_eq!(le(1.0).evaluate(vec![ratio(Ok(f64::NAN), Ok(1.0))], "").outcome, Outcome::Invalid);
        assert!(positive(0.0, "IOPS").is_err() && positive(f64::NAN, "p99.99").is_err());
        assert!(finite(-1.0, "loss").is_err() && finite(0.0, "loss").is_ok());
    }

    #[test]
    fn one_degenerate_pair_makes_the_whole_check_invalid_and_says_which() {
        let c = le(1.0).evaluate(vec![Ok(0.5), Err("readers did 0 IOPS".into()), Ok(0.6)], "");
        assert_eq!(c.outcome, Outcome::Invalid);
        assert!(c.reason.contains("sample 2: readers did 0 IOPS"), "{}", c.reason);
        assert!(c.measured.is_none());
    }

    #[test]
    fn paired_ratios_zip_rounds() {
        let a = [2.0, 4.0, 0.0];
        let b = [1.0, 2.0, 0.0];
        let s = paired(&a, &b, |v| positive(*v, "rate"));
        assert_eq!(s[0], Ok(2.0));
        assert_eq!(s[1], Ok(2.0));
        assert!(s[2].is_err());
    }

    #[test]
    fn skipped_fails_strict_but_within_noise_does_not() {
        assert!(le(1.0).skipped("mode not run").outcome.fails_strict());
        assert!(!Outcome::WithinNoise.fails_strict() && !Outcome::Met.fails_strict());
    }
}
