//! Statistics over repeats: medians, spread, and the repeats that collapsed.
//!
//! Every scenario runs its modes in rounds (each round runs every mode once, in an
//! order that rotates from round to round), so each mode has one value per round.
//! Tables show the median and the spread ((max - min) / median); a repeat that fell to
//! a quarter of its siblings' median (or rose to four times it) is flagged rather than
//! averaged away.

use netlane_report::{Flag, FlagKind, Value};

use crate::verdict::Measure;

pub use netlane::metrics::median;

/// A repeat more than this factor away from its siblings' median has collapsed.
pub const COLLAPSE_FACTOR: f64 = 4.0;
/// Repeats spread by more than this share of their median are noisy.
pub const NOISY_SPREAD: f64 = 0.5;

pub use netlane_report::Spread;

/// Indices of repeats that collapsed: with at least three repeats, those more than
/// [`COLLAPSE_FACTOR`] below or above the median of the others.
pub fn collapsed(values: &[f64]) -> Vec<usize> {
    if values.len() < 3 {
        return Vec::new();
    }
    (0..values.len())
        .filter(|&i| {
            let others: Vec<f64> = values.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, v)| *v).collect();
            let m = median(others);
            let v = values[i];
            m.is_finite() && m > 0.0 && v.is_finite() && (v * COLLAPSE_FACTOR < m || v > m * COLLAPSE_FACTOR)
        })
        .collect()
}

/// Flags for one mode's repeats of its main figure: collapsed repeats, and a spread
/// above [`NOISY_SPREAD`]. `what` names the figure with its unit (`tx MB/s`).
pub fn repeat_flags(subject: &str, what: &str, values: &[f64]) -> Vec<Flag> {
    let mut flags = Vec::new();
    let bad = collapsed(values);
    for &i in &bad {
        let others: Vec<f64> = values.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, v)| *v).collect();
        flags.push(Flag {
            kind: FlagKind::Collapsed,
            subject: subject.to_string(),
            message: format!(
                "round {} measured {} {what} while its other repeats' median was {}",
                i + 1,
                sig(values[i]),
                sig(median(others))
            ),
        });
    }
    if bad.is_empty()
        && let Some(s) = Spread::of(values)
        && let Some(r) = s.relative()
        && r > NOISY_SPREAD
    {
        flags.push(Flag {
            kind: FlagKind::Noisy,
            subject: subject.to_string(),
            message: format!(
                "{what} spread {:.0}% across {} repeats ({} .. {})",
                r * 100.0,
                s.n,
                sig(s.min),
                sig(s.max)
            ),
        });
    }
    flags
}

/// The defined values of `f` over `rs` (a run's figure, or why it has none).
pub fn values<T>(rs: &[T], f: impl Fn(&T) -> Measure) -> Vec<f64> {
    rs.iter().filter_map(|r| f(r).ok()).collect()
}

/// A table cell: the median of the defined values of `f` over `rs`, missing when none is.
pub fn med<T>(rs: &[T], f: impl Fn(&T) -> Measure) -> Value {
    let v = values(rs, f);
    if v.is_empty() { Value::Missing } else { Value::num(median(v)) }
}

/// Three significant digits, for messages.
pub fn sig(v: f64) -> String {
    if !v.is_finite() {
        return "NaN".into();
    }
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The order of `n` modes in round `round`: rotated so that each mode goes first in
/// turn (a run's position after another measurably shifts its cost).
pub fn round_order(n: usize, round: usize) -> Vec<usize> {
    (0..n).map(|i| (i + round) % n.max(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_relative() {
        let s = Spread::of(&[2.0, 1.0, 3.0, f64::NAN]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(s.relative(), Some(1.0));
        assert_eq!(Spread::of(&[5.0]).unwrap().relative(), None);
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn a_collapsed_repeat_is_found() {
        // A poll queue at 6 IOPS while its other repeats did 40 K.
        assert_eq!(collapsed(&[40_000.0, 6.0, 41_000.0]), vec![1]);
        assert!(collapsed(&[40_000.0, 39_000.0, 41_000.0]).is_empty());
        assert!(collapsed(&[40_000.0, 6.0]).is_empty(), "two repeats cannot tell which one collapsed");
        let f = repeat_flags("poll queue", "IOPS", &[40_000.0, 6.0, 41_000.0]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FlagKind::Collapsed);
        assert!(f[0].message.contains("round 2"), "{}", f[0].message);
    }

    #[test]
    fn noisy_repeats_are_flagged() {
        let f = repeat_flags("gso", "tx MB/s", &[100.0, 180.0, 120.0]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FlagKind::Noisy);
        assert!(repeat_flags("gso", "tx MB/s", &[100.0, 110.0, 105.0]).is_empty());
    }

    #[test]
    fn rounds_rotate() {
        assert_eq!(round_order(3, 0), vec![0, 1, 2]);
        assert_eq!(round_order(3, 1), vec![1, 2, 0]);
        assert_eq!(round_order(3, 5), vec![2, 0, 1]);
    }
}
