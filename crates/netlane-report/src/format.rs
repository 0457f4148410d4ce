//! Numbers for people: decimal prefixes (k, M, G), durations in the unit that reads
//! best (`250 µs`, `25.8 ms`), rates with their unit. Machine output never uses these.

use crate::model::{Op, Target, Unit, Value};

/// Three significant digits with a decimal prefix: `1.23k`, `45.6M`, `0.152`.
pub fn si(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    let (x, p) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    format!("{}{p}", sig3(x))
}

/// Three significant digits without exponent, trailing zeros dropped: `1.5`, `250`,
/// `0.0125`.
pub fn sig3(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x == 0.0 { "0".into() } else { "-".into() };
    }
    let digits = 3 - 1 - x.abs().log10().floor() as i32;
    let d = digits.clamp(0, 9) as usize;
    let s = format!("{x:.d$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// A duration given in seconds: `850 ns`, `250 µs`, `25.8 ms`, `2.5 s`.
pub fn seconds(s: f64) -> String {
    if !s.is_finite() {
        return "-".into();
    }
    let a = s.abs();
    if a == 0.0 {
        "0 s".into()
    } else if a < 1e-6 {
        format!("{} ns", sig3(s * 1e9))
    } else if a < 1e-3 {
        format!("{} µs", sig3(s * 1e6))
    } else if a < 1.0 {
        format!("{} ms", sig3(s * 1e3))
    } else {
        format!("{} s", sig3(s))
    }
}

/// A byte rate: `1.2 GB/s`, `850 MB/s`.
pub fn bytes_per_second(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    let (x, u) = if a >= 1e9 {
        (v / 1e9, "GB/s")
    } else if a >= 1e6 {
        (v / 1e6, "MB/s")
    } else if a >= 1e3 {
        (v / 1e3, "kB/s")
    } else {
        (v, "B/s")
    };
    format!("{} {u}", sig3(x))
}

/// A value of `unit` as an axis tick or a caption.
pub fn with_unit(unit: &Unit, v: f64) -> String {
    match unit {
        Unit::Seconds => seconds(v),
        Unit::BytesPerSecond => bytes_per_second(v),
        Unit::Percent => format!("{}%", sig3(v)),
        Unit::Ratio => format!("{}x", sig3(v)),
        Unit::Count(_) | Unit::Category => si(v),
        Unit::Nines => nines_label(v),
    }
}

/// The x of percentile `p` (0..100) on a "nines" axis: -log10(1 - p/100).
pub fn nines_x(p: f64) -> f64 {
    -(1.0 - p / 100.0).max(1e-9).log10()
}

/// The percentile at `x` of a "nines" axis, as a label (`99.9%`).
pub fn nines_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    let s = format!("{p:.4}");
    format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
}

/// A table cell with `decimals` decimals (`-` when missing).
pub fn cell(v: &Value, decimals: u8) -> String {
    match v {
        Value::Num(x) if x.is_finite() => format!("{x:.d$}", d = usize::from(decimals)),
        Value::Int(i) => i.to_string(),
        Value::Text(t) => t.clone(),
        _ => "-".into(),
    }
}

/// A number with up to `max` decimals, trailing zeros dropped (`0.25`, `1`).
pub fn plain(v: f64, max: usize) -> String {
    let s = format!("{v:.max$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// `<= 0.25 x`, `within 0.98..1.02 x`.
pub fn target(t: &Target) -> String {
    let u = if t.unit.is_empty() { String::new() } else { format!(" {}", t.unit) };
    let v = plain(t.value, 4);
    match t.op {
        Op::Below => format!("< {v}{u}"),
        Op::AtMost => format!("<= {v}{u}"),
        Op::Above => format!("> {v}{u}"),
        Op::AtLeast => format!(">= {v}{u}"),
        Op::Within => format!("within {v}..{}{u}", plain(t.upper.unwrap_or(f64::NAN), 4)),
    }
}

/// How a measured value prints next to its target: 3 significant digits and the unit.
pub fn measured(v: f64, unit: &str) -> String {
    let u = if unit.is_empty() { String::new() } else { format!(" {unit}") };
    format!("{}{u}", sig3(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_numbers() {
        assert_eq!(si(300_000.0), "300k");
        assert_eq!(si(1_234_567.0), "1.23M");
        assert_eq!(si(0.152), "0.152");
        assert_eq!(si(42.0), "42");
        assert_eq!(sig3(1.0), "1");
        assert_eq!(sig3(0.0125), "0.0125");
        assert_eq!(seconds(25.76e-3), "25.8 ms");
        assert_eq!(seconds(1.0304e-3), "1.03 ms");
        assert_eq!(seconds(250e-6), "250 µs");
        assert_eq!(seconds(2.0), "2 s");
        assert_eq!(bytes_per_second(1.5e9), "1.5 GB/s");
        assert_eq!(with_unit(&Unit::Ratio, 0.7), "0.7x");
    }

    #[test]
    fn nines_axis() {
        assert!((nines_x(99.0) - 2.0).abs() < 1e-9);
        assert!((nines_x(90.0) - 1.0).abs() < 1e-9);
        assert_eq!(nines_label(nines_x(99.9)), "99.9%");
        assert_eq!(nines_label(nines_x(50.0)), "50%");
        assert_eq!(nines_label(4.0), "99.99%");
    }

    #[test]
    fn targets_print_as_people_write_them() {
        let t = Target { op: Op::AtMost, value: 0.25, upper: None, unit: "x".into() };
        assert_eq!(target(&t), "<= 0.25 x");
        let w = Target { op: Op::Within, value: 0.98, upper: Some(1.02), unit: "x".into() };
        assert_eq!(target(&w), "within 0.98..1.02 x");
    }
}
