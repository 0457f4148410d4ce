//! A device's RSS configuration: which receive queue each entry of its indirection
//! table sends flows to, and its hash key; read for `nic show`, set and put back like
//! every other setting (what `ethtool -x` and `ethtool -X equal N | weight ... | hkey`
//! do).

use std::collections::BTreeMap;
use std::io;

use serde::{Deserialize, Serialize};

use super::settings::{Outcome, rx_queues};
use crate::error::{IoError, chain};
use crate::installed::{Change, Held, Place};

/// A device's RSS configuration as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Rss {
    /// The indirection table: entry i names the receive queue of flows whose hash
    /// selects i.
    pub indir: Vec<u32>,
    /// The hash key, as `ethtool -x` spells it (`6d:5a:...`).
    pub key: String,
    /// The hash functions in use (`toeplitz`, `xor`, `crc32`; a bit this list does not
    /// know as `bit N`).
    pub hfunc: Vec<String>,
}

impl Rss {
    /// `dev`'s RSS configuration. An error where it has none (veth, loopback:
    /// `EOPNOTSUPP`).
    pub fn read(dev: &str) -> Result<Rss, IoError> {
        let r = netlane_sys::ethtool::get_rxfh(dev).map_err(|e| IoError::new(format!("ethtool -x {dev}"), e))?;
        // include/uapi/linux/ethtool.h: ETH_RSS_HASH_TOP_BIT, _XOR_BIT, _CRC32_BIT.
        let names = ["toeplitz", "xor", "crc32"];
        let hfunc = (0..8)
            .filter(|b| r.hfunc & (1 << b) != 0)
            .map(|b| names.get(b).map_or_else(|| format!("bit {b}"), |n| n.to_string()))
            .collect();
        Ok(Rss { indir: r.indir, key: key_words(&r.key), hfunc })
    }

    /// Its table (when `table`) and its key (when `key`): the parts a change wrote.
    pub fn parts(&self, table: bool, key: bool) -> RssParts {
        RssParts {
            indir: if table { self.indir.clone() } else { Vec::new() },
            key: if key { self.key.clone() } else { String::new() },
            default_table: false,
        }
    }

    /// How many table entries each receive queue has (`rx-0 64, rx-1 64`).
    pub fn spread(&self) -> String {
        let mut per: BTreeMap<u32, usize> = BTreeMap::new();
        for q in &self.indir {
            *per.entry(*q).or_default() += 1;
        }
        per.iter().map(|(q, n)| format!("rx-{q} {n}")).collect::<Vec<_>>().join(", ")
    }
}

impl std::fmt::Display for Rss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hfunc = if self.hfunc.is_empty() { "unknown".into() } else { self.hfunc.join(",") };
        write!(f, "{} entries ({}), hash {hfunc}, key {}", self.indir.len(), self.spread(), self.key)
    }
}

/// A key as `ethtool -x` prints it: its bytes in hexadecimal, colon-separated.
pub fn key_words(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// A key as `ethtool -X hkey` takes it (`6d:5a:...`), or plain hexadecimal.
pub fn parse_key(s: &str) -> Result<Vec<u8>, String> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    if hex.is_empty() || !hex.len().is_multiple_of(2) || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("{s:?}: expected a key in hexadecimal bytes (6d:5a:56:...)"));
    }
    Ok((0..hex.len()).step_by(2).filter_map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect())
}

/// How to fill an indirection table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RssTable {
    /// Spread evenly over the first N receive queues (`ethtool -X equal N`).
    Equal(u32),
    /// Receive queue i takes a share of the entries in proportion to weight i
    /// (`ethtool -X weight W0 W1 ...`; a weight of 0 gives it none).
    Weights(Vec<u32>),
}

impl RssTable {
    /// The table of `size` entries this fills, or why it cannot be filled.
    pub fn fill(&self, size: usize) -> Result<Vec<u32>, String> {
        match self {
            RssTable::Equal(0) => Err("equal 0: no receive queue to spread over".into()),
            RssTable::Equal(n) => Ok((0..size).map(|i| (i % *n as usize) as u32).collect()),
            RssTable::Weights(w) => {
                let sum: u64 = w.iter().map(|x| u64::from(*x)).sum();
                if sum == 0 {
                    return Err("weights that are all 0 send flows nowhere".into());
                }
                // Entry i goes to the queue whose share of [0, sum) holds i * sum / size:
                // each queue's entries are contiguous and in proportion to its weight.
                let mut table = Vec::with_capacity(size);
                let (mut queue, mut upto) = (0usize, u64::from(w[0]));
                for i in 0..size as u64 {
                    let at = i * sum / size as u64;
                    while at >= upto {
                        queue += 1;
                        upto += u64::from(w[queue]);
                    }
                    table.push(queue as u32);
                }
                Ok(table)
            }
        }
    }

    /// The highest receive queue it names.
    fn top_queue(&self) -> u32 {
        match self {
            RssTable::Equal(n) => n.saturating_sub(1),
            RssTable::Weights(w) => w.iter().rposition(|x| *x > 0).unwrap_or(0) as u32,
        }
    }
}

impl std::str::FromStr for RssTable {
    type Err = String;

    /// `equal N` or `weights W0,W1,...`, as [`RssTable`]'s `Display` spells them.
    fn from_str(s: &str) -> Result<RssTable, String> {
        let bad = || format!("{s:?}: expected `equal N` or `weights W0,W1,...`");
        let (kind, rest) = s.trim().split_once(' ').ok_or_else(bad)?;
        let number = |w: &str| w.trim().parse::<u32>().map_err(|_| bad());
        match kind {
            "equal" => Ok(RssTable::Equal(number(rest)?)),
            "weights" => Ok(RssTable::Weights(rest.split(',').map(number).collect::<Result<_, _>>()?)),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for RssTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RssTable::Equal(n) => write!(f, "equal {n}"),
            RssTable::Weights(w) => {
                write!(f, "weights {}", w.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","))
            }
        }
    }
}

/// What to set of a device's RSS configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RssSetting {
    /// A new indirection table.
    pub table: Option<RssTable>,
    /// A new hash key (the device's size).
    pub key: Option<Vec<u8>>,
}

impl RssSetting {
    fn words(&self) -> String {
        let mut w = Vec::new();
        if let Some(t) = &self.table {
            w.push(t.to_string());
        }
        if let Some(k) = &self.key {
            w.push(format!("key {}", key_words(k)));
        }
        w.join(", ")
    }
}

/// The parts of an RSS configuration a change wrote (an empty part: not written).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssParts {
    /// The indirection table.
    pub indir: Vec<u32>,
    /// The key, as [`key_words`] spells it.
    pub key: String,
    /// The table is the kernel's default spread (`i % receive queues`), which the driver
    /// keeps following as its queues change: put back by resetting it, never by writing
    /// it, which would pin it (the kernel marks a written table as the user's).
    #[serde(default)]
    pub default_table: bool,
}

impl RssParts {
    /// These parts of `r`: those `which` has.
    pub(crate) fn of(r: &Rss, which: &RssParts) -> RssParts {
        r.parts(!which.indir.is_empty(), !which.key.is_empty())
    }

    /// Writes these parts to `dev`: the table, then the key, each in a call of its own
    /// (kernels before the 2024 fix "ethtool: fix setting key and resetting indir at
    /// once" read a key given beside a table reset from the wrong place).
    pub(crate) fn write(&self, dev: &str) -> io::Result<()> {
        use netlane_sys::ethtool::{RxfhSet, set_rxfh};
        if self.default_table {
            set_rxfh(dev, &RxfhSet { indir: Some(&[]), key: None })?;
        } else if !self.indir.is_empty() {
            set_rxfh(dev, &RxfhSet { indir: Some(&self.indir), key: None })?;
        }
        if !self.key.is_empty() {
            let key = parse_key(&self.key).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            set_rxfh(dev, &RxfhSet { indir: None, key: Some(&key) })?;
        }
        Ok(())
    }
}

impl std::fmt::Display for RssParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut w = Vec::new();
        if !self.indir.is_empty() {
            let r = Rss { indir: self.indir.clone(), key: String::new(), hfunc: Vec::new() };
            // The spread alone does not tell two tables apart: their digest does.
            w.push(format!("table of {} ({}) #{:08x}", self.indir.len(), r.spread(), digest(&self.indir)));
        }
        if !self.key.is_empty() {
            w.push(format!("key {}", self.key));
        }
        f.write_str(&w.join(", "))
    }
}

/// FNV-1a over a table's entries: which table, in eight hexadecimal digits.
fn digest(indir: &[u32]) -> u32 {
    indir.iter().flat_map(|e| e.to_le_bytes()).fold(0x811c_9dc5, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Sets `asked` of `dev`'s RSS configuration until the returned guard drops (`None` when
/// refused).
pub fn set_rss(dev: &str, asked: &RssSetting) -> (Outcome, Option<Held>) {
    let what = format!("RSS of {dev}: {}", asked.words());
    let refused = |why: String| (Outcome { asked: what.clone(), applied: None, refused: Some(why) }, None);
    let before = match Rss::read(dev) {
        Ok(b) => b,
        Err(e) => return refused(chain(&e).to_string()),
    };
    let mut value = RssParts::default();
    if let Some(t) = &asked.table {
        let queues = rx_queues(dev).len();
        if t.top_queue() as usize >= queues {
            return refused(format!("{t} names rx-{}: {dev} has {queues} receive queues", t.top_queue()));
        }
        if before.indir.is_empty() {
            return refused(format!("{dev} reports no indirection table"));
        }
        match t.fill(before.indir.len()) {
            Ok(table) => value.indir = table,
            Err(why) => return refused(why),
        }
    }
    if let Some(k) = &asked.key {
        let size = parse_key(&before.key).map_or(0, |b| b.len());
        if k.len() != size {
            return refused(format!("a {}-byte key: {dev}'s is {size} bytes", k.len()));
        }
        value.key = key_words(k);
    }
    let place = match Place::here() {
        Ok(p) => p,
        Err(err) => return refused(format!("find this namespace: {err}")),
    };
    let write = value.clone();
    let mut was = RssParts::of(&before, &value);
    let queues = rx_queues(dev).len().max(1) as u32;
    was.default_table = !was.indir.is_empty() && was.indir.iter().enumerate().all(|(i, q)| *q == i as u32 % queues);
    let change = Change::Rss { place, ifname: dev.to_string(), before: was, value };
    match Held::make(change, || {
        write.write(dev).map_err(|e| io::Error::new(e.kind(), format!("ethtool -X {dev} {}: {e}", asked.words())))
    }) {
        Ok(held) => {
            let now = Rss::read(dev)
                .map_or_else(|e| format!("unreadable: {}", chain(&e)), |r| RssParts::of(&r, &write).to_string());
            (Outcome { asked: what, applied: Some(now), refused: None }, Some(held))
        }
        Err(err) => refused(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_weighted_tables_spread_as_ethtool_does() {
        assert_eq!(RssTable::Equal(2).fill(6).unwrap(), [0, 1, 0, 1, 0, 1]);
        assert_eq!(RssTable::Weights(vec![1, 1]).fill(4).unwrap(), [0, 0, 1, 1]);
        assert_eq!(RssTable::Weights(vec![0, 3, 1]).fill(8).unwrap(), [1, 1, 1, 1, 1, 1, 2, 2]);
        assert_eq!(RssTable::Weights(vec![1, 0]).fill(3).unwrap(), [0, 0, 0]);
        let t = RssTable::Weights(vec![5, 2, 9, 1]).fill(128).unwrap();
        assert_eq!(t.len(), 128);
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "each queue's entries together");
        assert_eq!(RssTable::Weights(vec![5, 2, 9, 0]).top_queue(), 2);
        assert!(RssTable::Equal(0).fill(4).is_err());
        assert!(RssTable::Weights(vec![0, 0]).fill(4).is_err());
        assert!(RssTable::Weights(vec![]).fill(4).is_err());
        assert_eq!("equal 4".parse::<RssTable>(), Ok(RssTable::Equal(4)));
        assert_eq!("weights 1, 0,2".parse::<RssTable>(), Ok(RssTable::Weights(vec![1, 0, 2])));
        for t in [RssTable::Equal(3), RssTable::Weights(vec![2, 1])] {
            assert_eq!(t.to_string().parse::<RssTable>(), Ok(t));
        }
        for bad in ["equal", "equal x", "weights", "weights 1,,2", "spread 2"] {
            assert!(bad.parse::<RssTable>().is_err(), "{bad}");
        }
    }

    #[test]
    fn two_tables_with_the_same_spread_read_differently() {
        let parts = |indir: Vec<u32>| RssParts { indir, ..RssParts::default() }.to_string();
        let (alternating, halves) = (parts(vec![0, 1, 0, 1]), parts(vec![0, 0, 1, 1]));
        assert!(alternating.starts_with("table of 4 (rx-0 2, rx-1 2) #"), "{alternating}");
        assert_ne!(alternating, halves);
        assert_eq!(alternating, parts(vec![0, 1, 0, 1]));
    }

    #[test]
    fn keys_are_read_and_spelt_as_ethtool_does() {
        assert_eq!(parse_key("6d:5a:0F").unwrap(), [0x6d, 0x5a, 0x0f]);
        assert_eq!(parse_key("6d5a").unwrap(), [0x6d, 0x5a]);
        assert_eq!(key_words(&[0x6d, 0x5a, 0x0f]), "6d:5a:0f");
        for bad in ["", "6", "6d:5", "zz", "6d:5a:é"] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_device_without_rss_refuses_with_the_kernels_reason() {
        let (o, held) = set_rss("lo", &RssSetting { table: Some(RssTable::Equal(1)), key: None });
        assert!(held.is_none());
        assert_eq!(o.asked, "RSS of lo: equal 1");
        assert!(o.refused.as_deref().unwrap().starts_with("ethtool -x lo: Operation not supported"), "{o}");
    }
}
