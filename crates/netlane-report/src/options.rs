//! Resolved options, written once and shown two ways: an object with typed values and
//! the unit in each key (`time_s: 2`, `rates_bytes_per_s: [...]`) for machines, and
//! `key=value` lines that the command line reads back (`time=2s`,
//! `rates=10MB/s,1GB/s`: prefix `--` to reuse one).
//!
//! Also the command-line value parsers every scenario shares.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use netlane::cpus::CpuList;
use netlane::metrics::units::{self, compact_rate, format_duration, format_size};
use serde_json::{Map, Value, json};

/// One resolved option.
#[derive(Debug, Clone)]
enum Opt {
    Duration(Duration),
    Rate(u64),
    Rates(Vec<u64>),
    Size(u64),
    Int(u64),
    Num(f64),
    Ints(Vec<u64>),
    Bool(bool),
    Text(String),
    Words(Vec<String>),
    Cpus(CpuList),
}

/// Options in the order a scenario lists them.
#[derive(Debug, Clone, Default)]
pub struct OptionList(Vec<(String, Opt)>);

impl OptionList {
    /// An empty list.
    pub fn new() -> OptionList {
        OptionList::default()
    }

    fn push(mut self, name: &str, o: Opt) -> OptionList {
        self.0.push((name.to_string(), o));
        self
    }

    /// A duration (`--time 2s`).
    pub fn duration(self, name: &str, d: Duration) -> Self {
        self.push(name, Opt::Duration(d))
    }
    /// A byte rate.
    pub fn rate(self, name: &str, r: u64) -> Self {
        self.push(name, Opt::Rate(r))
    }
    /// Byte rates.
    pub fn rates(self, name: &str, r: &[u64]) -> Self {
        self.push(name, Opt::Rates(r.to_vec()))
    }
    /// A size in bytes.
    pub fn size(self, name: &str, b: u64) -> Self {
        self.push(name, Opt::Size(b))
    }
    /// A count.
    pub fn int(self, name: &str, v: u64) -> Self {
        self.push(name, Opt::Int(v))
    }
    /// A number that need not be whole (a rate of requests, a ratio).
    pub fn num(self, name: &str, v: f64) -> Self {
        self.push(name, Opt::Num(v))
    }
    /// Counts.
    pub fn ints(self, name: &str, v: &[u64]) -> Self {
        self.push(name, Opt::Ints(v.to_vec()))
    }
    /// A switch.
    pub fn flag(self, name: &str, on: bool) -> Self {
        self.push(name, Opt::Bool(on))
    }
    /// A word or path.
    pub fn text(self, name: &str, t: impl Into<String>) -> Self {
        self.push(name, Opt::Text(t.into()))
    }
    /// Words (modes, parts).
    pub fn words<S: AsRef<str>>(self, name: &str, w: &[S]) -> Self {
        self.push(name, Opt::Words(w.iter().map(|s| s.as_ref().to_string()).collect()))
    }
    /// A CPU list.
    pub fn cpus(self, name: &str, c: &CpuList) -> Self {
        self.push(name, Opt::Cpus(c.clone()))
    }
    /// Appends another list.
    pub fn extend(mut self, other: OptionList) -> Self {
        self.0.extend(other.0);
        self
    }

    /// `key=value` lines in command-line syntax.
    pub fn echo(&self) -> Vec<String> {
        let join = |v: Vec<String>| v.join(",");
        self.0
            .iter()
            .map(|(k, o)| {
                let v = match o {
                    Opt::Duration(d) => format_duration(*d),
                    Opt::Rate(r) => compact_rate(*r),
                    Opt::Rates(r) => join(r.iter().map(|r| compact_rate(*r)).collect()),
                    Opt::Size(b) => format_size(*b),
                    Opt::Int(v) => v.to_string(),
                    Opt::Num(v) => v.to_string(),
                    Opt::Ints(v) => join(v.iter().map(u64::to_string).collect()),
                    Opt::Bool(b) => b.to_string(),
                    Opt::Text(t) => t.clone(),
                    Opt::Words(w) => w.join(","),
                    Opt::Cpus(c) => c.to_string(),
                };
                format!("{k}={v}")
            })
            .collect()
    }

    /// The typed object: snake_case keys with the unit (`time_s`, `burst_bytes`).
    pub fn object(&self) -> Map<String, Value> {
        let mut m = Map::new();
        for (k, o) in &self.0 {
            let key = k.replace('-', "_");
            let (key, v) = match o {
                Opt::Duration(d) => (format!("{key}_s"), json!(d.as_secs_f64())),
                Opt::Rate(r) => (format!("{key}_bytes_per_s"), json!(r)),
                Opt::Rates(r) => (format!("{key}_bytes_per_s"), json!(r)),
                Opt::Size(b) => (format!("{key}_bytes"), json!(b)),
                Opt::Int(v) => (key, json!(v)),
                Opt::Num(v) => (key, json!(v)),
                Opt::Ints(v) => (key, json!(v)),
                Opt::Bool(b) => (key, json!(b)),
                Opt::Text(t) => (key, json!(t)),
                Opt::Words(w) => (key, json!(w)),
                Opt::Cpus(c) => (key, json!(c.to_string())),
            };
            m.insert(key, v);
        }
        m
    }
}

/// clap parser: a byte rate (`10MB/s`, `200mbit`), zero and negative refused.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    units::parse_rate(s).map_err(|e| e.to_string())
}

/// clap parser: a duration above zero (`2s`, `500ms`; a bare number is seconds).
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = units::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!("duration {s:?}: must be positive"));
    }
    Ok(d)
}

/// clap parser: a duration, zero allowed.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

/// clap parser: a size (`64k`, `1M`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

/// clap parser: a size (`64k`, `1M`) in memory, as a `usize`.
pub fn parse_size_usize(s: &str) -> Result<usize, String> {
    let v = parse_size(s)?;
    usize::try_from(v).map_err(|_| format!("{s} is too large"))
}

/// clap parser: a rate or count with an SI suffix, as sizes and byte rates take units:
/// `10k` is 10,000, `1.5M` 1,500,000, `2G` 2,000,000,000 (either case; `/s` may follow).
pub fn parse_count_f64(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let bad = || format!("{s:?}: expected a number (k, M or G for thousands, millions, billions: 10k)");
    let v = num.parse::<f64>().map_err(|_| bad())? * mult;
    if v.is_finite() && v >= 0.0 { Ok(v) } else { Err(bad()) }
}

/// clap parser: a whole count with an SI suffix (`20k`), as [`parse_count_f64`] reads it.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let v = parse_count_f64(s)?;
    if v.fract() != 0.0 || v >= u64::MAX as f64 {
        return Err(format!("{s:?}: expected a whole number"));
    }
    Ok(v as u64)
}

/// An endpoint as every peer tool takes one: `HOST:PORT`, `[V6ADDR]:PORT`, or a host or
/// address alone when `default_port` is given. A host name is resolved (`/etc/hosts`,
/// then DNS) and its first IPv4 address taken, else its first address: `localhost`
/// then reaches a server listening on 127.0.0.1.
pub fn parse_endpoint(s: &str, default_port: Option<u16>) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bare = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')).unwrap_or(s);
    if let (Ok(ip), Some(port)) = (bare.parse::<IpAddr>(), default_port) {
        return Ok(SocketAddr::new(ip, port));
    }
    let (host, port) = match s.rsplit_once(':') {
        // `host:port` (an IPv6 address has more than one colon and parsed above).
        Some((h, p)) if !h.contains(':') => {
            (h, p.parse::<u16>().map_err(|_| format!("{s}: {p:?} is not a port (0 to 65535)"))?)
        }
        _ => match default_port {
            Some(port) => (s, port),
            None => return Err(format!("{s}: expected HOST:PORT or [V6ADDR]:PORT")),
        },
    };
    if host.is_empty() || host.starts_with('-') || host.chars().any(char::is_whitespace) {
        return Err(format!("{s}: expected HOST:PORT or [V6ADDR]:PORT"));
    }
    let all: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| format!("{s}: {host} cannot be resolved ({e})"))?.collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().ok_or_else(|| format!("{s}: {host} has no address"))
}

/// clap parser: one online CPU (`3`).
pub fn parse_cpu(s: &str) -> Result<usize, String> {
    match netlane::cpus::parse_online(s)?.as_slice() {
        [c] => Ok(*c),
        _ => Err(format!("{s}: one CPU")),
    }
}

/// clap parser: a pacing quantum, `auto` or a duration.
pub fn parse_quantum(s: &str) -> Result<netlane::pace::Quantum, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(netlane::pace::Quantum::Auto);
    }
    let d = parse_positive_duration(s)?;
    Ok(netlane::pace::Quantum::Fixed(d.as_nanos() as u64))
}

/// A quantum as the command line writes it.
pub fn quantum_name(q: netlane::pace::Quantum) -> String {
    match q {
        netlane::pace::Quantum::Auto => "auto".into(),
        netlane::pace::Quantum::Fixed(ns) => format_duration(Duration::from_nanos(ns)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_si_suffixes() {
        assert_eq!(parse_count("10k"), Ok(10_000));
        assert_eq!(parse_count("1.5M"), Ok(1_500_000));
        assert_eq!(parse_count("2g"), Ok(2_000_000_000));
        assert_eq!(parse_count("20000"), Ok(20_000));
        assert_eq!(parse_count_f64("2.5k/s"), Ok(2_500.0));
        assert_eq!(parse_count_f64("0.5"), Ok(0.5));
        for bad in ["", "k", "ten", "-1k", "1.5", "1e400", "nan"] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoints_take_host_names_addresses_and_default_ports() {
        let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(parse_endpoint("127.0.0.1:7070", None), Ok(v4("127.0.0.1:7070")));
        assert_eq!(parse_endpoint("[::1]:7070", None), Ok(v4("[::1]:7070")));
        assert_eq!(parse_endpoint("127.0.0.1", Some(11211)), Ok(v4("127.0.0.1:11211")));
        assert_eq!(parse_endpoint("[::1]", Some(4420)), Ok(v4("[::1]:4420")));
        assert_eq!(parse_endpoint("localhost:9", None), Ok(v4("127.0.0.1:9")));
        assert_eq!(parse_endpoint("localhost", Some(4420)), Ok(v4("127.0.0.1:4420")));
        for (bad, says) in [
            ("localhost", "expected HOST:PORT"),
            ("127.0.0.1", "expected HOST:PORT"),
            ("localhost:http", "is not a port"),
            ("localhost:70000", "is not a port"),
            (":80", "expected HOST:PORT"),
        ] {
            let e = parse_endpoint(bad, None).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    fn list() -> OptionList {
        OptionList::new()
            .duration("time", Duration::from_millis(2500))
            .rates("rates", &[10_000_000, 1_000_000_000])
            .ints("flows", &[1, 100])
            .size("burst", 32 * 1024)
            .flag("ipv6", false)
            .words("modes", &["udp", "gso"])
            .cpus("cpus", &"0-1,3".parse().unwrap())
            .num("rate", 2000.0)
            .num("get-ratio", 0.9)
    }

    #[test]
    fn echo_is_command_line_syntax() {
        assert_eq!(
            list().echo(),
            [
                "time=2.5s",
                "rates=10MB/s,1GB/s",
                "flows=1,100",
                "burst=32K",
                "ipv6=false",
                "modes=udp,gso",
                "cpus=0-1,3",
                "rate=2000",
                "get-ratio=0.9"
            ]
        );
    }

    #[test]
    fn echoed_values_parse_back() {
        let e = list().echo();
        let v = |k: &str| e.iter().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap().to_string();
        assert_eq!(parse_positive_duration(&v("time")).unwrap(), Duration::from_millis(2500));
        let rates: Vec<u64> = v("rates").split(',').map(|r| parse_rate(r).unwrap()).collect();
        assert_eq!(rates, [10_000_000, 1_000_000_000]);
        assert_eq!(parse_size(&v("burst")).unwrap(), 32 * 1024);
    }

    #[test]
    fn object_has_typed_values_and_units_in_keys() {
        let o = list().object();
        assert_eq!(o["time_s"], json!(2.5));
        assert_eq!(o["rates_bytes_per_s"], json!([10_000_000u64, 1_000_000_000u64]));
        assert_eq!(o["flows"], json!([1, 100]));
        assert_eq!(o["burst_bytes"], json!(32768));
        assert_eq!(o["ipv6"], json!(false));
        assert_eq!(o["cpus"], json!("0-1,3"));
        // Numbers as numbers, not strings ("2000").
        assert_eq!((o["rate"].clone(), o["get_ratio"].clone()), (json!(2000.0), json!(0.9)));
    }

    #[test]
    fn quanta() {
        assert_eq!(parse_quantum("auto").unwrap(), netlane::pace::Quantum::Auto);
        assert_eq!(parse_quantum("250us").unwrap(), netlane::pace::Quantum::Fixed(250_000));
        assert!(parse_quantum("0ms").is_err() && parse_quantum("soon").is_err());
        assert_eq!(quantum_name(netlane::pace::Quantum::Fixed(25_760_000)), "25.76ms");
    }
}
