//! The balancer's configuration: VIPs, their reals and weights, read from TOML and
//! validated with errors that name the offending entry.
//!
//! ```toml
//! ring_size = 65537            # Maglev ring per VIP (a prime); optional
//! conn_entries = 1048576       # connection-table entries (all CPUs); optional
//! max_new_conns_per_cpu = 125000  # flood guard; 0 = off; optional
//! udp_timeout_s = 30           # idle UDP flows forget their real; 0 = never; optional
//!
//! [[vip]]
//! address = "10.100.0.1"
//! port = 80                    # 0 = every port of this address and protocol
//! proto = "tcp"                # tcp or udp
//! no_lru = false               # true: no connection state, pure consistent hashing
//!
//! [[vip.real]]
//! address = "10.200.0.2"
//! weight = 2                   # optional, default 1; 0 drains the real
//! ```

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use serde::Deserialize;

use crate::proto::maglev;

/// Default Maglev ring size per VIP (Katran's).
pub const DEFAULT_RING: u32 = 65537;
/// Largest configuration file taken, bytes: one with every real the maps hold
/// (524,288, about 45 bytes each) is about 24 MiB.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// Longest excerpt of the configuration an error quotes, bytes either side.
const EXCERPT: usize = 40;
/// Longest error message, bytes (a message may quote a value from the file).
const MAX_MESSAGE: usize = 300;

/// Largest weight accepted.
pub const MAX_WEIGHT: u32 = 1000;

/// Most connection-table entries (an LRU hash over all CPUs; 2^24 entries take about
/// 1.5 GiB of kernel memory).
pub const MAX_CONN_ENTRIES: u32 = 1 << 24;

/// Most VIPs in a configuration.
pub const MAX_VIPS_TOTAL: u32 = 65_536;

/// Most ring slots over all VIPs (4 bytes each: 1 GiB).
pub const MAX_RING_SLOTS: u64 = 1 << 28;

/// Most reals over all VIPs: half of what a tag can name (`TAG_VALUES`, 2^20), since a
/// reload keeps the old reals beside the new ones until it is done.
pub const MAX_REALS_TOTAL: u32 = 1 << 19;

/// Transport protocol of a VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP (IP protocol 6).
    Tcp,
    /// UDP (IP protocol 17).
    Udp,
}

impl Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
}

/// A backend server.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Real {
    /// Its address; packets are encapsulated to it (IPIP or IPv6-in-IPv6).
    pub address: IpAddr,
    /// Relative weight (0 = drained: no new flows).
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// A virtual service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vip {
    /// Address clients connect to.
    pub address: IpAddr,
    /// Port (0 = any port).
    #[serde(default)]
    pub port: u16,
    /// Protocol.
    pub proto: Proto,
    /// No connection-table state: every packet is hashed onto the ring.
    #[serde(default)]
    pub no_lru: bool,
    /// Its reals.
    #[serde(rename = "real", default)]
    pub reals: Vec<Real>,
}

impl Vip {
    /// `address:port/proto`, for messages.
    pub fn name(&self) -> String {
        let port = if self.port == 0 { "*".to_string() } else { self.port.to_string() };
        match self.address {
            IpAddr::V4(a) => format!("{a}:{port}/{:?}", self.proto).to_lowercase(),
            IpAddr::V6(a) => format!("[{a}]:{port}/{:?}", self.proto).to_lowercase(),
        }
    }

    /// The Maglev backends of this VIP, in configuration order.
    pub fn backends(&self) -> Vec<maglev::Backend> {
        self.reals
            .iter()
            .map(|r| maglev::Backend {
                key: match r.address {
                    IpAddr::V4(a) => a.octets().to_vec(),
                    IpAddr::V6(a) => a.octets().to_vec(),
                },
                weight: r.weight,
            })
            .collect()
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Maglev ring size per VIP.
    #[serde(default = "default_ring")]
    pub ring_size: u32,
    /// Connection-table entries, shared by all CPUs' LRU lists.
    #[serde(default = "default_conn_entries")]
    pub conn_entries: u32,
    /// New connections each CPU records per second (0 = no limit).
    #[serde(default = "default_new_conns")]
    pub max_new_conns_per_cpu: u32,
    /// Idle UDP flows forget their real after this many seconds (0 = never).
    #[serde(default = "default_udp_timeout")]
    pub udp_timeout_s: u32,
    /// The VIPs.
    #[serde(rename = "vip", default)]
    pub vips: Vec<Vip>,
}

fn default_ring() -> u32 {
    DEFAULT_RING
}

fn default_conn_entries() -> u32 {
    1 << 20
}

fn default_new_conns() -> u32 {
    125_000
}

fn default_udp_timeout() -> u32 {
    30
}

/// A configuration problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not valid TOML, or a field of the wrong type or name.
    #[error("{0}")]
    Syntax(String),
    /// A semantic problem, naming where.
    #[error("{0}")]
    Invalid(String),
}

/// A TOML error as one bounded line: where, what, and a short excerpt around it (the
/// parser's own rendering quotes the whole line, which may be the whole file).
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let msg = bounded(e.message().trim(), MAX_MESSAGE).replace('\n', " ");
    let Some(span) = e.span() else { return msg };
    let at = floor_boundary(text, span.start.min(text.len()));
    let line = text[..at].matches('\n').count() + 1;
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..at].chars().count() + 1;
    let from = floor_boundary(text, at.saturating_sub(EXCERPT).max(line_start));
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let to = floor_boundary(text, (at + EXCERPT).min(line_end));
    let ellipsis = |cut: bool| if cut { "..." } else { "" };
    format!(
        "line {line}, column {column}: {msg} (near `{}{}{}`)",
        ellipsis(from > line_start),
        text[from..to].trim_end_matches('\r'),
        ellipsis(to < line_end)
    )
}

/// `s` cut to at most `max` bytes (on a character boundary), marked when cut.
fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{}... ({} bytes)", &s[..floor_boundary(s, max)], s.len())
}

/// The largest character boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Config {
    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax(syntax_error(text, &e)))?;
        c.validate().map_err(|e| match e {
            ConfigError::Invalid(m) => ConfigError::Invalid(bounded(&m, MAX_MESSAGE)),
            other => other,
        })?;
        Ok(c)
    }

    /// Checks everything a data plane relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.ring_size > maglev::MAX_RING {
            return bad(format!("ring_size {} is above the largest ring, {}", self.ring_size, maglev::MAX_RING));
        }
        if self.ring_size < maglev::MIN_RING || !maglev::is_prime(self.ring_size) {
            return bad(format!("ring_size {} must be a prime of at least 7 (e.g. 65537)", self.ring_size));
        }
        if !(64..=MAX_CONN_ENTRIES).contains(&self.conn_entries) {
            return bad(format!("conn_entries {} must be 64..={MAX_CONN_ENTRIES}", self.conn_entries));
        }
        if self.vips.is_empty() {
            return bad("no [[vip]] configured".into());
        }
        if self.udp_timeout_s > 86_400 {
            return bad(format!("udp_timeout_s {} is above a day", self.udp_timeout_s));
        }
        if self.vips.len() > MAX_VIPS_TOTAL as usize {
            return bad(format!("{} VIPs; at most {MAX_VIPS_TOTAL}", self.vips.len()));
        }
        let slots = self.vips.len() as u64 * u64::from(self.ring_size);
        if slots > MAX_RING_SLOTS {
            return bad(format!(
                "{} VIPs x ring_size {} = {slots} ring slots ({} MiB); at most {MAX_RING_SLOTS}: lower ring_size",
                self.vips.len(),
                self.ring_size,
                (slots * 4) >> 20
            ));
        }
        let total: usize = self.vips.iter().map(|v| v.reals.len()).sum();
        if total > MAX_REALS_TOTAL as usize {
            return bad(format!(
                "{total} reals in all; at most {MAX_REALS_TOTAL} (a destination tag names one of 2^20, and a \
                 reload needs room for the new reals beside the old)"
            ));
        }
        let mut seen = HashSet::new();
        for v in &self.vips {
            let name = v.name();
            if !seen.insert((v.address, v.port, v.proto)) {
                return bad(format!("VIP {name} is configured twice"));
            }
            if v.address.is_unspecified() || v.address.is_multicast() {
                return bad(format!("VIP {name}: {} cannot be a VIP address", v.address));
            }
            if v.reals.is_empty() {
                return bad(format!("VIP {name} has no [[vip.real]]"));
            }
            if v.reals.len() > self.ring_size as usize {
                return bad(format!("VIP {name}: {} reals exceed the ring of {}", v.reals.len(), self.ring_size));
            }
            let mut reals = HashSet::new();
            for r in &v.reals {
                if !reals.insert(r.address) {
                    return bad(format!("VIP {name}: real {} is listed twice", r.address));
                }
                if r.weight > MAX_WEIGHT {
                    return bad(format!("VIP {name}: real {} weight {} is above {MAX_WEIGHT}", r.address, r.weight));
                }
                if r.address.is_unspecified() || r.address.is_multicast() {
                    return bad(format!("VIP {name}: {} cannot be a real's address", r.address));
                }
                // IPv4 VIPs may be carried to IPv6 reals (IPv4-in-IPv6); IPv6 packets
                // cannot be carried in IPv4.
                if v.address.is_ipv6() && r.address.is_ipv4() {
                    return bad(format!("VIP {name}: an IPv6 VIP cannot use the IPv4 real {}", r.address));
                }
            }
            if v.reals.iter().all(|r| r.weight == 0) {
                return bad(format!("VIP {name}: every real has weight 0"));
            }
        }
        Ok(())
    }

    /// The VIP with this address, port and protocol.
    pub fn vip(&self, address: IpAddr, port: u16, proto: Proto) -> Option<&Vip> {
        self.vips.iter().find(|v| v.address == address && v.port == port && v.proto == proto)
    }
}

/// How one VIP's Maglev ring divides among its reals (what `netlane lb check` shows).
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct VipShares {
    /// `address:port/proto`.
    pub vip: String,
    /// Connection tracking is off for this VIP.
    pub no_lru: bool,
    /// Each real's part of the ring, in configuration order.
    pub reals: Vec<RealShare>,
}

/// One real's part of its VIP's ring.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct RealShare {
    /// The real.
    pub address: IpAddr,
    /// Its weight.
    pub weight: u32,
    /// Ring slots it owns.
    pub slots: usize,
    /// Its share of the ring, percent.
    pub share_pct: f64,
}

impl Config {
    /// Every VIP's ring shares.
    pub fn shares(&self) -> Result<Vec<VipShares>, maglev::RingError> {
        let mut out = Vec::new();
        for v in &self.vips {
            let b = v.backends();
            let ring = maglev::build(&b, self.ring_size)?;
            let slots = maglev::shares(&ring, b.len());
            out.push(VipShares {
                vip: v.name(),
                no_lru: v.no_lru,
                reals: v
                    .reals
                    .iter()
                    .zip(slots)
                    .map(|(r, n)| RealShare {
                        address: r.address,
                        weight: r.weight,
                        slots: n,
                        share_pct: 100.0 * n as f64 / f64::from(self.ring_size),
                    })
                    .collect(),
            });
        }
        Ok(out)
    }
}

/// What changing from one configuration to another does to one VIP.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct VipChange {
    /// The VIP.
    pub vip: String,
    /// Reals added.
    pub added: Vec<IpAddr>,
    /// Reals removed.
    pub removed: Vec<IpAddr>,
    /// Reals whose weight changed.
    pub reweighted: Vec<IpAddr>,
    /// Ring slots that now point at a different real.
    pub slots_moved: usize,
}

/// A VIP's key: what makes two VIP entries the same VIP.
pub(crate) type VipKey = (IpAddr, u16, Proto);

impl Vip {
    pub(crate) fn key(&self) -> VipKey {
        (self.address, self.port, self.proto)
    }
}

/// A changed VIP's Maglev rings, slots indexing its reals in the old and the new
/// configuration (no old ring for a new VIP or a new ring size).
#[derive(Debug, Clone)]
pub(crate) struct VipRings {
    pub old: Option<Vec<maglev::Slot>>,
    pub new: Vec<maglev::Slot>,
}

/// The per-VIP effect of moving from `old` to `new` (VIPs only in one of them are
/// reported with all their reals added or removed).
pub fn diff(old: &Config, new: &Config) -> Result<Vec<VipChange>, maglev::RingError> {
    Ok(diff_with_rings(old, new)?.0)
}

/// [`diff`], and the rings of every VIP that changed: only those are built (a ring is
/// built in time proportional to its size, and reordering a VIP's reals moves nothing).
pub(crate) fn diff_with_rings(
    old: &Config,
    new: &Config,
) -> Result<(Vec<VipChange>, HashMap<VipKey, VipRings>), maglev::RingError> {
    let mut out = Vec::new();
    let mut rings = HashMap::new();
    let old_by_key: HashMap<VipKey, &Vip> = old.vips.iter().map(|v| (v.key(), v)).collect();
    let same_size = old.ring_size == new.ring_size;
    for n in &new.vips {
        let o = old_by_key.get(&n.key()).copied();
        if same_size && o.is_some_and(|o| o.reals == n.reals) {
            continue;
        }
        // Weights by address: a VIP may have hundreds of thousands of reals.
        let old_weights: HashMap<IpAddr, u32> =
            o.map(|o| o.reals.iter().map(|r| (r.address, r.weight)).collect()).unwrap_or_default();
        let new_addrs: HashSet<IpAddr> = n.reals.iter().map(|r| r.address).collect();
        let added: Vec<IpAddr> =
            n.reals.iter().filter(|r| !old_weights.contains_key(&r.address)).map(|r| r.address).collect();
        let removed: Vec<IpAddr> = o
            .map(|o| o.reals.iter().filter(|r| !new_addrs.contains(&r.address)).map(|r| r.address).collect())
            .unwrap_or_default();
        let reweighted: Vec<IpAddr> = n
            .reals
            .iter()
            .filter(|r| old_weights.get(&r.address).is_some_and(|&w| w != r.weight))
            .map(|r| r.address)
            .collect();
        let changed = !(added.is_empty() && removed.is_empty() && reweighted.is_empty());
        if o.is_some() && same_size && !changed {
            continue;
        }
        let nb = n.backends();
        let new_ring = maglev::build(&nb, new.ring_size)?;
        let (slots_moved, old_ring) = match o {
            Some(o) if same_size => {
                let ob = o.backends();
                let old_ring = maglev::build(&ob, old.ring_size)?;
                (maglev::moved(&old_ring, &ob, &new_ring, &nb), Some(old_ring))
            }
            _ => (new_ring.len(), None),
        };
        if o.is_none() || slots_moved > 0 || changed {
            out.push(VipChange { vip: n.name(), added, removed, reweighted, slots_moved });
            rings.insert(n.key(), VipRings { old: old_ring, new: new_ring });
        }
    }
    let new_keys: HashSet<VipKey> = new.vips.iter().map(Vip::key).collect();
    for o in old.vips.iter().filter(|o| !new_keys.contains(&o.key())) {
        out.push(VipChange {
            vip: o.name(),
            added: Vec::new(),
            removed: o.reals.iter().map(|r| r.address).collect(),
            reweighted: Vec::new(),
            slots_moved: old.ring_size as usize,
        });
    }
    Ok((out, rings))
}

#[cfg(test)]
mod tests;
