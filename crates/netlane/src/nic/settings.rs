//! A device's settings changed for as long as a guard lives, each reported applied
//! (read back) or refused (the kernel's reason), and put back.

use std::io;

use serde::Serialize;

use super::rss::{Rss, RssSetting, set_rss};
use super::{read_trim, reason};
use crate::cpus::CpuList;
use crate::installed::{Change, Held, Place, hold_device_file, irq_affinity_path, values_words};
use crate::topology::Rtnl;
use crate::topology::ethtool::{Ethtool, Group, Values};

/// What became of a setting asked of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Outcome {
    /// What was asked (`channels of eth1: combined=4`).
    pub asked: String,
    /// Applied: the value read back afterwards (which may differ from the asked one
    /// where the driver rounds).
    pub applied: Option<String>,
    /// Refused: the kernel's reason.
    pub refused: Option<String>,
}

impl Outcome {
    fn refused(asked: String, why: String) -> Outcome {
        Outcome { asked, applied: None, refused: Some(why) }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.applied, &self.refused) {
            (Some(v), _) => write!(f, "{}: applied, reads {v}", self.asked),
            (None, Some(why)) => write!(f, "{}: refused: {why}", self.asked),
            (None, None) => write!(f, "{}: not tried", self.asked),
        }
    }
}

/// Sets `values` of `group` on `dev` until the returned guard drops (`None` when
/// refused).
pub fn set_group(dev: &str, group: Group, values: &Values) -> (Outcome, Option<Held>) {
    let asked = format!("{group} of {dev}: {}", values_words(values, values));
    if let Some(bad) = values.keys().find(|k| !group.can_set(k)) {
        return (
            Outcome::refused(asked, format!("{bad} is not a setting of {group} (it has {})", group.settable())),
            None,
        );
    }
    let mut e = match Ethtool::open() {
        Ok(e) => e,
        Err(err) => return (Outcome::refused(asked, reason(&err)), None),
    };
    let before = match e.settings(dev, group) {
        Ok(b) => b,
        Err(err) => return (Outcome::refused(asked, reason(&err)), None),
    };
    let place = match Place::here() {
        Ok(p) => p,
        Err(err) => return (Outcome::refused(asked, format!("find this namespace: {err}")), None),
    };
    let before: Values = values.keys().filter_map(|k| before.get(k).map(|v| (k.clone(), *v))).collect();
    let change = |value: Values| Change::Ethtool {
        place: place.clone(),
        ifname: dev.to_string(),
        group,
        before: before.clone(),
        value,
    };
    let made = Held::make(change(values.clone()), || {
        e.set_settings(dev, group, values).map_err(|err| io::Error::new(err.source.kind(), reason(&err)))
    });
    match made {
        Ok(mut held) => match e.settings(dev, group) {
            Ok(now) => {
                // What the driver made of it (it may round): what is put back from.
                let read: Values = values.keys().filter_map(|k| now.get(k).map(|v| (k.clone(), *v))).collect();
                if let Err(err) = held.amend(change(read)) {
                    tracing::warn!(error = %err, "could not amend the record of a device setting");
                }
                (Outcome { asked, applied: Some(values_words(&now, values)), refused: None }, Some(held))
            }
            Err(err) => {
                (Outcome { asked, applied: Some(format!("unreadable: {}", reason(&err))), refused: None }, Some(held))
            }
        },
        Err(err) => (Outcome::refused(asked, err.to_string()), None),
    }
}

/// Moves interrupt `irq` to `cpus` until the returned guard drops (`None` when refused).
pub fn set_irq_cpus(irq: u32, cpus: &CpuList) -> (Outcome, Option<Held>) {
    let asked = format!("IRQ {irq} on CPUs {cpus}");
    let path = irq_affinity_path(irq);
    let before = match std::fs::read_to_string(&path) {
        Ok(b) => b.trim().to_string(),
        Err(err) => return (Outcome::refused(asked, format!("read {}: {err}", path.display())), None),
    };
    let was = before.clone();
    let change = Change::IrqAffinity { irq, before, value: cpus.to_string() };
    match Held::make(change, || std::fs::write(&path, cpus.to_string())) {
        Ok(mut held) => {
            let read = read_trim(&path.to_string_lossy());
            // The kernel's spelling of the list (`1-2` for `1,2`): what is put back from.
            if let Some(now) = &read
                && let Err(err) = held.amend(Change::IrqAffinity { irq, before: was.clone(), value: now.clone() })
            {
                tracing::warn!(error = %err, "could not amend the record of an interrupt's CPUs");
            }
            let now = read.unwrap_or_else(|| "unreadable".into());
            (Outcome { asked, applied: Some(now), refused: None }, Some(held))
        }
        Err(err) => (Outcome::refused(asked, err.to_string()), None),
    }
}

/// A file of a device (under `/sys/class/net/DEV/`, as this namespace's sysfs shows it)
/// and what to write there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSetting {
    /// What it sets (`threaded NAPI`, `tx-0 xps_cpus`).
    pub what: String,
    /// Its path under the device's directory.
    pub rel: String,
    /// The value.
    pub value: String,
}

impl FileSetting {
    /// The device's NAPI instances polled by kernel threads (or in softirq context).
    pub fn threaded_napi(on: bool) -> FileSetting {
        FileSetting { what: "threaded NAPI".into(), rel: "threaded".into(), value: if on { "1" } else { "0" }.into() }
    }
}

/// The transmit queues of `dev`, by number (none when it has no such directory).
pub fn tx_queues(dev: &str) -> Vec<usize> {
    queues(dev, "tx-")
}

/// The receive queues of `dev`, by number (none when it has no such directory).
pub fn rx_queues(dev: &str) -> Vec<usize> {
    queues(dev, "rx-")
}

/// `dev`'s queues whose sysfs directory starts with `kind`, by number, as this
/// namespace's sysfs lists them (whether the device is up or not).
fn queues(dev: &str, kind: &str) -> Vec<usize> {
    let mut q: Vec<usize> = std::fs::read_dir(format!("/sys/class/net/{dev}/queues"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix(kind)).and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    q.sort_unstable();
    q
}

/// The kernel's bitmap format (hexadecimal, 32-bit words separated by commas) with only
/// bit `i` set.
pub(crate) fn one_bit_mask(i: usize) -> String {
    (0..=i / 32)
        .rev()
        .map(|w| format!("{:08x}", if w == i / 32 { 1u32 << (i % 32) } else { 0 }))
        .collect::<Vec<_>>()
        .join(",")
}

/// XPS by CPU: transmit queue `i` of `dev` taken by the `i`-th CPU of `cpus` (wrapping
/// when it has more queues than `cpus` has CPUs; CPUs past the queues get none). An error
/// when `dev` has no transmit queues.
pub fn xps_cpus(dev: &str, cpus: &CpuList) -> Result<Vec<FileSetting>, String> {
    let tx = tx_queues(dev);
    if tx.is_empty() {
        return Err(format!("{dev} has no transmit queues under /sys/class/net/{dev}/queues"));
    }
    Ok(tx
        .iter()
        .enumerate()
        .filter_map(|(n, &i)| {
            let cpu = cpus.nth_wrapping(n)?;
            let rel = format!("queues/tx-{i}/xps_cpus");
            Some(FileSetting { what: format!("tx-{i} xps_cpus (CPU {cpu})"), rel, value: one_bit_mask(cpu) })
        })
        .collect())
}

/// XPS by receive queue (symmetric queues): transmit queue `i` of `dev` taken by sockets
/// whose packets arrive on receive queue `i` (transmit queues without a receive queue of
/// their number are left as they are). An error when `dev` has no transmit queues.
pub fn xps_rxqs(dev: &str) -> Result<Vec<FileSetting>, String> {
    let tx = tx_queues(dev);
    if tx.is_empty() {
        return Err(format!("{dev} has no transmit queues under /sys/class/net/{dev}/queues"));
    }
    let has_rx = |i: usize| std::path::Path::new(&format!("/sys/class/net/{dev}/queues/rx-{i}")).exists();
    Ok(tx
        .into_iter()
        .filter(|&i| has_rx(i))
        .map(|i| FileSetting {
            what: format!("tx-{i} xps_rxqs (rx-{i})"),
            rel: format!("queues/tx-{i}/xps_rxqs"),
            value: one_bit_mask(i),
        })
        .collect())
}

/// Receive flow steering's per-queue tables: `flows` entries shared out over `dev`'s
/// receive queues (`rps_flow_cnt`; the kernel rounds each up to a power of two). RFS
/// steers only while the global `net.core.rps_sock_flow_entries` is set too. An error
/// when `dev` has no receive queues.
pub fn rfs_flow_counts(dev: &str, flows: u32) -> Result<Vec<FileSetting>, String> {
    let rx = rx_queues(dev);
    if rx.is_empty() {
        return Err(format!("{dev} has no receive queues under /sys/class/net/{dev}/queues"));
    }
    let each = (flows as usize / rx.len()).max(1);
    Ok(rx
        .into_iter()
        .map(|i| FileSetting {
            what: format!("rx-{i} rps_flow_cnt"),
            rel: format!("queues/rx-{i}/rps_flow_cnt"),
            value: each.to_string(),
        })
        .collect())
}

/// Writes `f` to `dev`'s file until the returned guard drops (`None` when refused).
pub fn set_file(dev: &str, f: &FileSetting) -> (Outcome, Option<Held>) {
    let asked = format!("{} of {dev}: {}", f.what, f.value);
    let path = format!("/sys/class/net/{dev}/{}", f.rel);
    match hold_device_file(&path, &f.value) {
        Ok(held) => {
            let now = read_trim(&path).unwrap_or_else(|| "unreadable".into());
            (Outcome { asked, applied: Some(now), refused: None }, Some(held))
        }
        Err(err) => (Outcome::refused(asked, format!("write {path}: {err}")), None),
    }
}

/// A token-bucket bottleneck (tbf) as a device's root qdisc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bottleneck {
    /// Bytes per second.
    pub rate: u64,
    /// Bytes of bucket.
    pub burst: u32,
    /// Bytes of queue, beyond which packets are dropped.
    pub limit: u32,
}

/// Makes `b` `dev`'s root qdisc until the returned guard drops, which removes it (the
/// device's default comes back); `None` when refused.
pub fn set_bottleneck(dev: &str, b: &Bottleneck) -> (Outcome, Option<Held>) {
    let asked = format!("tbf root qdisc of {dev}: {} B/s, burst {} B, queue {} B", b.rate, b.burst, b.limit);
    hold_root_qdisc(dev, "tbf", asked, |r, ifindex| r.add_tbf(ifindex, b.rate, b.burst, b.limit))
}

/// A root qdisc that releases packets at their SO_TXTIME times, or paces each socket to
/// its SO_MAX_PACING_RATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacingQdisc {
    /// fq: per-flow queues, release times on CLOCK_MONOTONIC, socket pacing rates.
    Fq,
    /// etf: release times on CLOCK_TAI, each packet dequeued this many nanoseconds
    /// before its time. As a root qdisc it drops every packet without a CLOCK_TAI
    /// release time: ARP and neighbour discovery, TCP, any unpaced sender.
    Etf {
        /// The head start, nanoseconds: at least the time from the qdisc's timer to the
        /// wire, or packets miss their times and are dropped.
        delta_ns: u32,
    },
}

impl std::fmt::Display for PacingQdisc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PacingQdisc::Fq => f.write_str("fq"),
            PacingQdisc::Etf { delta_ns } => write!(f, "etf (CLOCK_TAI, delta {delta_ns} ns)"),
        }
    }
}

/// Makes `q` `dev`'s root qdisc until the returned guard drops, which removes it (the
/// device's default comes back); `None` when refused (a kernel without the qdisc answers
/// that it has no such kind).
pub fn set_pacing_qdisc(dev: &str, q: PacingQdisc) -> (Outcome, Option<Held>) {
    let asked = format!("{q} root qdisc of {dev}");
    match q {
        PacingQdisc::Fq => hold_root_qdisc(dev, "fq", asked, |r, i| r.add_fq(i, None)),
        PacingQdisc::Etf { delta_ns } => hold_root_qdisc(dev, "etf", asked, |r, i| r.add_etf(i, None, delta_ns)),
    }
}

/// Puts `q` under the single class (1:1) of `dev`'s root tbf: packets wait in it for
/// their release times (or their socket's pacing rate), then for the bucket's tokens. It
/// goes when the tbf does.
pub fn set_pacing_under_bottleneck(dev: &str, q: PacingQdisc) -> Outcome {
    let asked = format!("{q} under the tbf root qdisc of {dev}");
    let added = Rtnl::open().map_err(|e| format!("open rtnetlink: {e}")).and_then(|mut r| {
        let ifindex = r.link_index(dev).map_err(|e| reason(&e))?;
        let made = match q {
            PacingQdisc::Fq => r.add_fq(ifindex, Some((1, 1))),
            PacingQdisc::Etf { delta_ns } => r.add_etf(ifindex, Some((1, 1)), delta_ns),
        };
        made.map_err(|e| reason(&e))?;
        let qdiscs = r.qdiscs(ifindex).map_err(|e| reason(&e))?;
        let under = qdiscs.into_iter().find(|i| !i.root && i.parent == (1, 1));
        under.map(|i| i.kind).ok_or_else(|| "added, but no qdisc reads back under the bottleneck".to_string())
    });
    match added {
        Ok(kind) => Outcome { asked, applied: Some(kind), refused: None },
        Err(why) => Outcome::refused(asked, why),
    }
}

/// Makes mq `dev`'s root qdisc until the returned guard drops, which removes it: a child
/// qdisc per transmit queue, each counting what leaves by its queue (read with
/// [`tx_queue_packets`]); `None` when refused.
pub fn set_mq(dev: &str) -> (Outcome, Option<Held>) {
    hold_root_qdisc(dev, "mq", format!("mq root qdisc of {dev}"), |r, ifindex| r.add_root_qdisc(ifindex, "mq"))
}

/// Packets that left `dev` by each of its transmit queues (index: the queue), from the
/// classes of its mq root qdisc ([`set_mq`]); an error when it has none.
pub fn tx_queue_packets(dev: &str) -> Result<Vec<u64>, String> {
    let mut r = Rtnl::open().map_err(|e| format!("open rtnetlink: {e}"))?;
    let ifindex = r.link_index(dev).map_err(|e| reason(&e))?;
    match r.root_qdisc(ifindex).map_err(|e| reason(&e))? {
        Some((kind, _)) if kind == "mq" => {}
        other => {
            let kind = other.map_or_else(|| "noqueue".to_string(), |(k, _)| k);
            return Err(format!("{dev}'s root qdisc is {kind}, not mq: no per-queue counters"));
        }
    }
    let classes = r.class_stats(ifindex).map_err(|e| reason(&e))?;
    // mq's class :i is transmit queue i - 1.
    let queues = classes.iter().map(|((_, minor), _)| usize::from(*minor)).max().unwrap_or(0);
    let mut out = vec![0; queues];
    for ((_, minor), stats) in classes {
        if let Some(slot) = usize::from(minor).checked_sub(1).and_then(|i| out.get_mut(i)) {
            *slot = stats.packets;
        }
    }
    Ok(out)
}

/// A root qdisc of `kind` made by `add` on `dev` (in this namespace), recorded before
/// it is made and removed when the guard drops.
fn hold_root_qdisc(
    dev: &str,
    kind: &str,
    asked: String,
    add: impl FnOnce(&mut Rtnl, u32) -> Result<(), crate::topology::netlink::NetlinkError>,
) -> (Outcome, Option<Held>) {
    let mut r = match Rtnl::open() {
        Ok(r) => r,
        Err(err) => return (Outcome::refused(asked, format!("open rtnetlink: {err}")), None),
    };
    let ifindex = match r.link_index(dev) {
        Ok(i) => i,
        Err(err) => return (Outcome::refused(asked, reason(&err)), None),
    };
    let place = match Place::here() {
        Ok(p) => p,
        Err(err) => return (Outcome::refused(asked, format!("find this namespace: {err}")), None),
    };
    let change = Change::RootQdisc { place, ifindex, ifname: dev.to_string(), qdisc: kind.into() };
    let made = Held::make(change, || add(&mut r, ifindex).map_err(|err| io::Error::other(reason(&err))));
    match made {
        Ok(held) => {
            let now = root_qdisc_kind(dev).unwrap_or_else(|| "unreadable".into());
            (Outcome { asked, applied: Some(now), refused: None }, Some(held))
        }
        Err(err) => (Outcome::refused(asked, err.to_string()), None),
    }
}

/// The kind of `dev`'s root qdisc (`noqueue` without one), if it can be read.
fn root_qdisc_kind(dev: &str) -> Option<String> {
    let mut r = Rtnl::open().ok()?;
    let index = r.link_index(dev).ok()?;
    Some(r.root_qdisc(index).ok()?.map_or_else(|| "noqueue".into(), |(kind, _)| kind))
}

/// What [`try_settings`] found: what each setting did, and whether each was put back.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Tried {
    /// Each setting asked, applied (read back) or refused (the kernel's reason).
    pub outcomes: Vec<Outcome>,
    /// For each applied one, what it reads after it was put back, and whether that is
    /// what it was before.
    pub put_back: Vec<PutBack>,
}

/// One setting after it was put back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PutBack {
    /// The setting (`channels of eth1: combined`).
    pub what: String,
    /// Its value before.
    pub before: String,
    /// Its value now.
    pub now: String,
}

impl PutBack {
    /// Whether it reads as it did before.
    pub fn restored(&self) -> bool {
        self.before == self.now
    }
}

/// Where a setting that was changed is read again.
enum Reading {
    Ethtool { dev: String, group: Group, key: String },
    Irq(u32),
    File(String),
    RootQdisc(String),
    Rss { dev: String, table: bool, key: bool },
}

impl Reading {
    fn now(&self) -> String {
        match self {
            Reading::Ethtool { dev, group, key } => Ethtool::open()
                .ok()
                .and_then(|mut e| e.settings(dev, *group).ok())
                .and_then(|now| now.get(key).map(|v| v.to_string())),
            Reading::Irq(irq) => read_trim(&irq_affinity_path(*irq).to_string_lossy()),
            Reading::File(path) => read_trim(path),
            Reading::RootQdisc(dev) => root_qdisc_kind(dev),
            Reading::Rss { dev, table, key } => Rss::read(dev).ok().map(|r| r.parts(*table, *key).to_string()),
        }
        .unwrap_or_else(|| "?".into())
    }
}

/// Settings applied and held until [`Holding::put_back`] (or until dropped, which puts
/// them back too, unread).
pub struct Holding {
    /// Each setting asked, applied (read back) or refused (the kernel's reason).
    pub outcomes: Vec<Outcome>,
    held: Vec<Held>,
    watch: Vec<(String, String, Reading)>,
}

impl std::fmt::Debug for Holding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holding").field("outcomes", &self.outcomes).field("held", &self.held.len()).finish()
    }
}

impl Holding {
    /// Puts everything back (in the reverse order it was made) and reads it again.
    pub fn put_back(mut self) -> Tried {
        while let Some(h) = self.held.pop() {
            drop(h);
        }
        let put_back = std::mem::take(&mut self.watch)
            .into_iter()
            .map(|(what, before, r)| PutBack { what, before, now: r.now() })
            .collect();
        Tried { outcomes: std::mem::take(&mut self.outcomes), put_back }
    }
}

/// What to set on a device: ethtool groups (one group's settings each), interrupts'
/// CPUs, the device's files.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Ethtool settings, a group each.
    pub groups: Vec<(Group, Values)>,
    /// Interrupts and their CPUs.
    pub irqs: Vec<(u32, CpuList)>,
    /// The device's files.
    pub files: Vec<FileSetting>,
    /// A bottleneck as its root qdisc.
    pub bottleneck: Option<Bottleneck>,
    /// A pacing qdisc as its root qdisc.
    pub pacing_qdisc: Option<PacingQdisc>,
    /// Its RSS indirection table and hash key.
    pub rss: Option<RssSetting>,
}

impl Settings {
    /// Whether nothing is asked.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
            && self.irqs.is_empty()
            && self.files.is_empty()
            && self.bottleneck.is_none()
            && self.pacing_qdisc.is_none()
            && self.rss.is_none()
    }
}

/// Applies each of `asked` to `dev` and reads each back; they stay until the [`Holding`]
/// puts them back.
pub fn hold_settings(dev: &str, asked: &Settings) -> Holding {
    let Settings { groups, irqs, files, bottleneck, pacing_qdisc, rss } = asked;
    let mut outcomes = Vec::new();
    let mut held = Vec::new();
    let mut watch: Vec<(String, String, Reading)> = Vec::new();
    for (group, values) in groups {
        let before = Ethtool::open().ok().and_then(|mut e| e.settings(dev, *group).ok());
        let (outcome, h) = set_group(dev, *group, values);
        let applied = h.is_some();
        held.extend(h);
        if let (true, Some(before)) = (applied, before) {
            for key in values.keys() {
                let was = before.get(key).map_or("?".into(), |v| v.to_string());
                let reading = Reading::Ethtool { dev: dev.to_string(), group: *group, key: key.clone() };
                watch.push((format!("{group} of {dev}: {key}"), was, reading));
            }
        }
        outcomes.push(outcome);
    }
    for (irq, cpus) in irqs {
        let before = Reading::Irq(*irq).now();
        let (outcome, h) = set_irq_cpus(*irq, cpus);
        if let Some(h) = h {
            held.push(h);
            watch.push((format!("IRQ {irq}'s CPUs"), before, Reading::Irq(*irq)));
        }
        outcomes.push(outcome);
    }
    for f in files {
        let path = format!("/sys/class/net/{dev}/{}", f.rel);
        let before = read_trim(&path).unwrap_or_else(|| "?".into());
        let (outcome, h) = set_file(dev, f);
        if let Some(h) = h {
            held.push(h);
            watch.push((format!("{} of {dev}", f.what), before, Reading::File(path)));
        }
        outcomes.push(outcome);
    }
    if let Some(r) = rss {
        let before = Rss::read(dev).ok();
        let (outcome, h) = set_rss(dev, r);
        if let (Some(h), Some(before)) = (h, before) {
            held.push(h);
            let (table, key) = (r.table.is_some(), r.key.is_some());
            let was = before.parts(table, key).to_string();
            let reading = Reading::Rss { dev: dev.to_string(), table, key };
            watch.push((format!("RSS of {dev}"), was, reading));
        }
        outcomes.push(outcome);
    }
    let mut root = |set: &dyn Fn() -> (Outcome, Option<Held>)| -> bool {
        let before = root_qdisc_kind(dev).unwrap_or_else(|| "?".into());
        let (outcome, h) = set();
        if let Some(h) = h {
            held.push(h);
            watch.push((format!("root qdisc of {dev}"), before, Reading::RootQdisc(dev.to_string())));
        }
        let applied = outcome.applied.is_some();
        outcomes.push(outcome);
        applied
    };
    // With a bottleneck, a pacing qdisc goes under it (and nowhere without it).
    let under = match (bottleneck, pacing_qdisc) {
        (Some(b), q) => {
            let applied = root(&|| set_bottleneck(dev, b));
            q.map(|q| (q, applied))
        }
        (None, Some(q)) => {
            root(&|| set_pacing_qdisc(dev, *q));
            None
        }
        (None, None) => None,
    };
    match under {
        Some((q, true)) => outcomes.push(set_pacing_under_bottleneck(dev, q)),
        Some((q, false)) => outcomes.push(Outcome::refused(
            format!("{q} under the tbf root qdisc of {dev}"),
            "the bottleneck it goes under was refused".into(),
        )),
        None => {}
    }
    Holding { outcomes, held, watch }
}

/// Applies each of `asked` to `dev`, reads each back, then puts everything back and reads
/// it again: which settings a device takes, and proof that it is as it was.
pub fn try_settings(dev: &str, asked: &Settings) -> Tried {
    hold_settings(dev, asked).put_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_the_kernels_bitmap_format() {
        assert_eq!(one_bit_mask(0), "00000001");
        assert_eq!(one_bit_mask(5), "00000020");
        assert_eq!(one_bit_mask(33), "00000002,00000000");
    }
}
