//! Parsing and printing rates, sizes and durations as people write them.
//!
//! Rates: `10MB/s`, `1.5GB/s`, `200mbit`, `1gbit`, `500kB/s`, or a bare number of
//! bytes per second. Decimal units (1 MB = 10^6 bytes), as link rates are; `MiB/s`
//! and friends are binary. Sizes: `64k`, `1M`, `1400` (binary suffixes, as `tc` and
//! buffer sizes are). Durations: `250us`, `1ms`, `2s`, `1.5s`.

use std::fmt;
use std::time::Duration;

/// A value that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {input:?}: {reason}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    reason: String,
}

fn err(what: &'static str, input: &str, reason: impl Into<String>) -> ParseError {
    ParseError { what, input: input.to_string(), reason: reason.into() }
}

fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.' || *c == '-' || *c == '+'))
        .map_or(s.len(), |(i, _)| i);
    (&s[..end], s[end..].trim())
}

fn number(what: &'static str, input: &str, num: &str) -> Result<f64, ParseError> {
    let v: f64 = num.parse().map_err(|_| err(what, input, "expected a number with an optional unit"))?;
    if !v.is_finite() {
        return Err(err(what, input, "not a finite number"));
    }
    if v < 0.0 {
        return Err(err(what, input, "must not be negative"));
    }
    Ok(v)
}

/// Parses a rate into bytes per second. Zero is rejected: a rate must be positive.
pub fn parse_rate(input: &str) -> Result<u64, ParseError> {
    let s = input.trim();
    let (num, unit) = split_number(s);
    let v = number("rate", input, num)?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b/s" | "bps" => 1.0,
        "kb/s" => 1e3,
        "mb/s" => 1e6,
        "gb/s" => 1e9,
        "kib/s" => 1024.0,
        "mib/s" => 1024.0 * 1024.0,
        "gib/s" => 1024.0 * 1024.0 * 1024.0,
        "bit" | "bit/s" => 1.0 / 8.0,
        "kbit" | "kbit/s" => 1e3 / 8.0,
        "mbit" | "mbit/s" => 1e6 / 8.0,
        "gbit" | "gbit/s" => 1e9 / 8.0,
        _ => {
            return Err(err(
                "rate",
                input,
                "unknown unit (use B/s, kB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s, kbit, mbit or gbit)",
            ));
        }
    };
    let bytes = (v * mult).round();
    if bytes < 1.0 {
        return Err(err("rate", input, "must be positive"));
    }
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(err("rate", input, "too large"));
    }
    Ok(bytes as u64)
}

/// Parses a size in bytes (`k`/`M`/`G` suffixes are binary: 1k = 1024).
pub fn parse_size(input: &str) -> Result<u64, ParseError> {
    let s = input.trim();
    let (num, unit) = split_number(s);
    let v = number("size", input, num)?;
    let mult: f64 = match unit.to_ascii_lowercase().trim_end_matches('b') {
        "" => 1.0,
        "k" | "ki" => 1024.0,
        "m" | "mi" => 1024.0 * 1024.0,
        "g" | "gi" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(err("size", input, "unknown unit (use k, M or G)")),
    };
    let bytes = (v * mult).round();
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(err("size", input, "too large"));
    }
    Ok(bytes as u64)
}

/// Formats a byte count with a binary suffix when it divides evenly (`4K`, `1M`), else
/// as plain bytes.
pub fn format_size(bytes: u64) -> String {
    for (unit, div) in [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if bytes >= div && bytes.is_multiple_of(div) {
            return format!("{}{unit}", bytes / div);
        }
    }
    bytes.to_string()
}

/// Parses a duration with a unit (`250us`, `1.5ms`, `2s`, `1m30s`; humantime's
/// syntax), or a bare number of seconds (`2`, `0.5`), as fio takes `--runtime`.
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(err("duration", input, "empty (write e.g. 2s, 500ms or 250us)"));
    }
    let d = match s.parse::<f64>() {
        Ok(secs) if (0.0..=1e9).contains(&secs) => Duration::from_secs_f64(secs),
        Ok(secs) if secs < 0.0 => return Err(err("duration", input, "must not be negative")),
        Ok(_) => return Err(err("duration", input, "too long")),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| err("duration", input, format!("{e} (write a number with a unit: ns, us, ms, s, m, h)")))?,
    };
    Ok(d)
}

/// Prints a byte rate with a decimal unit, e.g. `1.23 GB/s`.
#[derive(Debug, Clone, Copy)]
pub struct Rate(pub f64);

/// A byte rate scaled to a decimal unit: `(value, unit)`.
fn scale_rate(v: f64) -> (f64, &'static str) {
    if v >= 1e9 {
        (v / 1e9, "GB/s")
    } else if v >= 1e6 {
        (v / 1e6, "MB/s")
    } else if v >= 1e3 {
        (v / 1e3, "kB/s")
    } else {
        (v, "B/s")
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (x, u) = scale_rate(self.0);
        write!(f, "{x:.2} {u}")
    }
}

/// Prints a byte rate as compactly as it was probably written: `10MB/s`, `1.5GB/s`.
pub fn compact_rate(bytes_per_sec: u64) -> String {
    let (x, u) = scale_rate(bytes_per_sec as f64);
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{u}")
}

/// Prints a duration exactly and compactly, in the largest unit it reaches: `250us`,
/// `25.76ms`, `1.0304ms`, `2s`. [`parse_duration`] reads it back to the same value.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    for (unit, scale, digits) in [("s", 1_000_000_000u128, 9), ("ms", 1_000_000, 6), ("us", 1_000, 3)] {
        if ns >= scale {
            let (whole, frac) = (ns / scale, ns % scale);
            if frac == 0 {
                return format!("{whole}{unit}");
            }
            let f = format!("{frac:0digits$}");
            return format!("{whole}.{}{unit}", f.trim_end_matches('0'));
        }
    }
    format!("{ns}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("10MB/s").unwrap(), 10_000_000);
        assert_eq!(parse_rate("1GB/s").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("1.5 GB/s").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("200mbit").unwrap(), 25_000_000);
        assert_eq!(parse_rate("1MiB/s").unwrap(), 1_048_576);
        assert_eq!(parse_rate("12345").unwrap(), 12345);
        for bad in ["0", "0MB/s", "-5MB/s", "fast", "10 furlongs", "", "NaN", "inf"] {
            assert!(parse_rate(bad).is_err(), "{bad} should be rejected");
        }
        let e = parse_rate("0MB/s").unwrap_err().to_string();
        assert!(e.contains("must be positive"), "{e}");
        let e = parse_rate("-5MB/s").unwrap_err().to_string();
        assert!(e.contains("negative"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("1400").unwrap(), 1400);
        assert_eq!(parse_size("32KiB").unwrap(), 32768);
        assert!(parse_size("1x").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("0.25ms").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        for bad in ["1 fortnight", "", "-2s", "-1", "soon"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_duration(Duration::from_micros(250)), "250us");
        assert_eq!(format_duration(Duration::from_millis(8)), "8ms");
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
        assert_eq!(format_duration(Duration::from_micros(25_760)), "25.76ms");
        assert_eq!(format_duration(Duration::from_nanos(1_030_400)), "1.0304ms");
        assert_eq!(format_duration(Duration::from_nanos(1_500)), "1.5us");
        assert_eq!(format_duration(Duration::from_nanos(17)), "17ns");
        for d in [250_000u64, 25_760_000, 1_030_400, 1_500, 2_000_000_000, 1_234_567_891, 17] {
            let d = Duration::from_nanos(d);
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{}", format_duration(d));
        }
    }

    #[test]
    fn compact_rates() {
        assert_eq!(compact_rate(10_000_000), "10MB/s");
        assert_eq!(compact_rate(1_500_000_000), "1.5GB/s");
        assert_eq!(compact_rate(21_840_000), "21.84MB/s");
        assert_eq!(compact_rate(999), "999B/s");
    }

    #[test]
    fn rate_display() {
        assert_eq!(Rate(1.5e9).to_string(), "1.50 GB/s");
        assert_eq!(Rate(336e6).to_string(), "336.00 MB/s");
    }
}
