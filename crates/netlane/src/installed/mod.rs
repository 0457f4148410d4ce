//! What netlane changes in the kernel that would outlive the process that changed it: a
//! root qdisc on a device, a cgroup, a sysctl, a NAPI instance's settings, a device's
//! file in sysfs (XPS maps, the device-wide NAPI knobs), a device's ethtool settings
//! (channels, rings, coalescing), an interrupt's CPUs. Each change is recorded in a file under
//! [`DIR`] when it is made and the record is removed when the change is undone, so a
//! process killed with SIGKILL (whose destructors never run) leaves records behind, and
//! [`clean_stale`] (`netlane clean`) undoes what they describe.
//!
//! BPF programs need no record: netlane attaches every one through a link held by a
//! file descriptor, and the kernel detaches it when the last descriptor closes, however
//! the process ended. Namespaces are recognised by name ([`crate::topology::registry`]).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::topology::ethtool::{Group, Values};
use crate::topology::netdev::NapiSettings;

mod undo;
pub(crate) use undo::remove_cgroup;
use undo::undo;

/// Where records live (tmpfs: a reboot undoes every change anyway).
pub const DIR: &str = "/run/netlane/installed";

/// The network namespace a change was made in (devices and `net.*` sysctls belong to
/// one).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Place {
    /// Its name under /run/netns, if it has one.
    pub netns: Option<String>,
    /// Its inode: a namespace made again under the same name is another one.
    pub netns_inode: u64,
}

impl Place {
    /// The calling thread's namespace.
    pub fn here() -> io::Result<Place> {
        let netns_inode = fs::metadata("/proc/thread-self/ns/net")?.ino();
        let netns = fs::read_dir(crate::topology::NETNS_RUN_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| fs::metadata(e.path()).is_ok_and(|m| m.ino() == netns_inode))
            .map(|e| e.file_name().to_string_lossy().into_owned());
        Ok(Place { netns, netns_inode })
    }

    /// Runs `undo` inside this namespace: by its name when it has one that still is
    /// this namespace, here when the caller is in it. `Ok` with a word when the
    /// namespace is gone (and what was in it with it).
    fn run(&self, undo: impl FnOnce() -> Result<String, String> + Send) -> Result<String, String> {
        if let Some(name) = &self.netns {
            let bound = Path::new(crate::topology::NETNS_RUN_DIR).join(name);
            return match fs::metadata(&bound) {
                Ok(m) if m.ino() == self.netns_inode => {
                    crate::topology::run_in_named(name, undo).map_err(|e| e.to_string())?
                }
                _ => Ok("gone with its namespace".into()),
            };
        }
        let here = fs::metadata("/proc/thread-self/ns/net").map(|m| m.ino()).map_err(|e| e.to_string())?;
        if here == self.netns_inode {
            undo()
        } else {
            Err("made in another network namespace: run netlane clean there".into())
        }
    }
}

/// One change to the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// A root qdisc of kind `qdisc` on device `ifname` (index `ifindex`).
    RootQdisc {
        /// Where.
        place: Place,
        /// Device index.
        ifindex: u32,
        /// Device name when installed.
        ifname: String,
        /// `htb` or `mqprio`.
        qdisc: String,
    },
    /// A cgroup (v2) directory.
    Cgroup {
        /// Its path.
        path: PathBuf,
    },
    /// A sysctl set to `value`; it was `before` (the same when a process only holds
    /// it at the value it found).
    Sysctl {
        /// Where (`net.*` sysctls belong to a network namespace).
        place: Place,
        /// Its path under /proc/sys.
        path: PathBuf,
        /// The value before.
        before: String,
        /// The value set.
        value: String,
    },
    /// Settings of NAPI instance `id` (of device `ifname`, index `ifindex`) written with
    /// netdev netlink's `napi-set`; only the settings in `value` were written.
    Napi {
        /// Where.
        place: Place,
        /// Device index.
        ifindex: u32,
        /// Device name when changed.
        ifname: String,
        /// The NAPI id.
        id: u32,
        /// The settings before (as `napi-get` reported them).
        before: NapiSettings,
        /// The settings written.
        value: NapiSettings,
    },
    /// Ethtool settings of device `ifname` (one group: channels, rings or coalescing);
    /// only the settings in `value` were written.
    Ethtool {
        /// Where.
        place: Place,
        /// The device.
        ifname: String,
        /// Which group.
        group: Group,
        /// Those settings before.
        before: Values,
        /// As written.
        value: Values,
    },
    /// Parts of device `ifname`'s RSS configuration (its indirection table, its hash key);
    /// only the parts in `value` were written.
    Rss {
        /// Where.
        place: Place,
        /// The device.
        ifname: String,
        /// Those parts before.
        before: crate::nic::RssParts,
        /// As written.
        value: crate::nic::RssParts,
    },
    /// Interrupt `irq`'s CPUs (`/proc/irq/N/smp_affinity_list`) set to `value`.
    IrqAffinity {
        /// The interrupt.
        irq: u32,
        /// Its CPUs before.
        before: String,
        /// As set.
        value: String,
    },
    /// A network device's file under `/sys/class/net` (as the namespace's own sysfs
    /// shows it) set to `value`.
    DeviceFile {
        /// Where.
        place: Place,
        /// Its path, `/sys/class/net/<device>/...`.
        path: PathBuf,
        /// The value before.
        before: String,
        /// The value set.
        value: String,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::RootQdisc { place, ifname, qdisc, .. } => {
                write!(f, "{qdisc} root qdisc on {ifname}")?;
                match &place.netns {
                    Some(n) => write!(f, " (namespace {n})"),
                    None => Ok(()),
                }
            }
            Change::Cgroup { path } => write!(f, "cgroup {}", path.display()),
            Change::Sysctl { path, before, value, .. } => {
                write!(f, "sysctl {} = {value} (was {before})", sysctl_name(path))
            }
            Change::Napi { ifname, id, before, value, .. } => {
                write!(f, "NAPI {id} of {ifname}: {} (was {})", napi_words(value, value), napi_words(before, value))
            }
            Change::DeviceFile { path, before, value, .. } => {
                write!(f, "{} = {value} (was {before})", path.display())
            }
            Change::Ethtool { ifname, group, before, value, .. } => {
                write!(f, "{group} of {ifname}: {} (was {})", values_words(value, value), values_words(before, value))
            }
            Change::IrqAffinity { irq, before, value } => write!(f, "IRQ {irq} on CPUs {value} (was {before})"),
            Change::Rss { ifname, before, value, .. } => write!(f, "RSS of {ifname}: {value} (was {before})"),
        }
    }
}

/// The settings `which` names, as `s` has them.
fn napi_words(s: &NapiSettings, which: &NapiSettings) -> String {
    let mut v = Vec::new();
    if which.defer_hard_irqs.is_some() {
        v.push(format!("defer-hard-irqs={}", s.defer_hard_irqs.map_or("?".into(), |x| x.to_string())));
    }
    if which.gro_flush_timeout_ns.is_some() {
        v.push(format!("gro-flush-timeout={}ns", s.gro_flush_timeout_ns.map_or("?".into(), |x| x.to_string())));
    }
    if which.irq_suspend_timeout_ns.is_some() {
        v.push(format!("irq-suspend-timeout={}ns", s.irq_suspend_timeout_ns.map_or("?".into(), |x| x.to_string())));
    }
    v.join(",")
}

/// The settings `which` names, as `s` has them (`combined=4,rx=2`; `?` where `s` lacks one).
pub(crate) fn values_words(s: &Values, which: &Values) -> String {
    which
        .keys()
        .map(|k| format!("{k}={}", s.get(k).map_or("?".into(), |v| v.to_string())))
        .collect::<Vec<_>>()
        .join(",")
}

/// Writes `value` to the device file at `path` (in the calling thread's `/sys`), held.
/// The record keeps the value as the kernel reads it back (`00000001` reads `1`), which
/// is what an undo compares with.
pub(crate) fn hold_device_file(path: &str, value: &str) -> std::io::Result<Held> {
    let before = std::fs::read_to_string(path)?.trim().to_string();
    let place = Place::here()?;
    let change =
        Change::DeviceFile { place: place.clone(), path: path.into(), before: before.clone(), value: value.into() };
    let mut held = Held::make(change, || std::fs::write(path, value))?;
    let now = std::fs::read_to_string(path)?.trim().to_string();
    held.amend(Change::DeviceFile { place, path: path.into(), before, value: now })?;
    Ok(held)
}

/// Where an interrupt's CPUs are set.
pub fn irq_affinity_path(irq: u32) -> PathBuf {
    PathBuf::from(format!("/proc/irq/{irq}/smp_affinity_list"))
}

fn sysctl_name(path: &Path) -> String {
    path.strip_prefix("/proc/sys").unwrap_or(path).to_string_lossy().replace('/', ".")
}

/// A change's record: removed when dropped, which its owner does once the change is
/// undone.
#[derive(Debug)]
pub struct Record {
    path: PathBuf,
}

impl Record {
    /// Leaves the record for `netlane clean`: the change could not be undone.
    pub fn keep(self) {
        std::mem::forget(self);
    }

    /// Replaces what the record says (written whole, then renamed over it).
    fn rewrite(&self, change: &Change) -> io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        fs::write(&tmp, serde_json::to_string(change).map_err(io::Error::other)?)?;
        fs::rename(&tmp, &self.path)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Records `change`, made by this process (written whole, then renamed into place, so
/// a reader never sees half a record).
pub fn record(change: &Change) -> io::Result<Record> {
    record_in(Path::new(DIR), change)
}

/// When process `pid` started (clock ticks after boot, `/proc/<pid>/stat`'s 22nd field):
/// with the pid, it names one process even after the pid is reused.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process that wrote a record still runs: its pid exists and, when the
/// record names its start time, started then (not a later process given the same pid).
fn alive(pid: u32, started: Option<u64>) -> bool {
    match started {
        Some(t) => start_time(pid) == Some(t),
        None => Path::new("/proc").join(pid.to_string()).exists(),
    }
}

fn record_in(dir: &Path, change: &Change) -> io::Result<Record> {
    fs::create_dir_all(dir)?;
    let pid = std::process::id();
    let name = format!("{pid}-{}-{}", start_time(pid).unwrap_or(0), SEQ.fetch_add(1, Ordering::Relaxed));
    let path = dir.join(format!("{name}.json"));
    let tmp = dir.join(format!(".{name}.tmp"));
    let text = serde_json::to_string(change).map_err(io::Error::other)?;
    fs::write(&tmp, text)?;
    fs::rename(&tmp, &path)?;
    Ok(Record { path })
}

/// What [`clean_stale`] did with one record of a process that is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleaned {
    /// The process that made the change.
    pub pid: u32,
    /// The change.
    pub change: Change,
    /// What was done (`Ok`: undone, or found undone already), or why it could not be
    /// (the record is kept for another try).
    pub outcome: Result<String, String>,
}

impl Change {
    /// What the change is to, whoever made it: two records of one target are two
    /// processes holding the same thing.
    fn target(&self) -> String {
        match self {
            Change::RootQdisc { place, ifindex, .. } => format!("qdisc {} {ifindex}", place.netns_inode),
            Change::Cgroup { path } => format!("cgroup {}", path.display()),
            Change::Sysctl { place, path, .. } => format!("sysctl {} {}", place.netns_inode, path.display()),
            Change::Napi { id, .. } => format!("napi {id}"),
            Change::DeviceFile { place, path, .. } => format!("file {} {}", place.netns_inode, path.display()),
            Change::Ethtool { place, ifname, group, .. } => format!("ethtool {} {ifname} {group}", place.netns_inode),
            Change::IrqAffinity { irq, .. } => format!("irq {irq}"),
            Change::Rss { place, ifname, .. } => format!("rss {} {ifname}", place.netns_inode),
        }
    }
}

/// Undoes the recorded changes of processes that no longer exist, and removes their
/// records; a change that cannot be undone here keeps its record and says why. A change
/// a running process also holds is left to it (a server started after a killed one
/// found the sysctl already set, say): its record is cleaned once that process is gone
/// too.
pub fn clean_stale() -> io::Result<Vec<Cleaned>> {
    clean_stale_in(Path::new(DIR))
}

fn clean_stale_in(dir: &Path) -> io::Result<Vec<Cleaned>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    // Named `<pid>-<start time>-<seq>.json` (`<pid>-<seq>.json` by earlier versions).
    let mut records: Vec<(PathBuf, u32, Option<u64>, u64, Change)> = paths
        .into_iter()
        .filter_map(|path| {
            let stem = path.file_name()?.to_str()?.strip_suffix(".json")?.to_string();
            let parts: Vec<&str> = stem.split('-').collect();
            let pid = parts.first()?.parse::<u32>().ok()?;
            let started = match parts.len() {
                3 => Some(parts[1].parse::<u64>().ok()?).filter(|t| *t != 0),
                _ => None,
            };
            let seq = parts.last()?.parse::<u64>().ok()?;
            // Not a record netlane wrote (or one from another version): left alone.
            let change = serde_json::from_str::<Change>(&fs::read_to_string(&path).ok()?).ok()?;
            Some((path, pid, started, seq, change))
        })
        .collect();
    // Each process's changes undone newest first, as its guards would have dropped (an
    // RSS table before the channels it spreads over).
    records.sort_by(|a, b| (a.1, a.2).cmp(&(b.1, b.2)).then(b.3.cmp(&a.3)));
    let records: Vec<(PathBuf, u32, bool, Change)> =
        records.into_iter().map(|(path, pid, started, _, change)| (path, pid, alive(pid, started), change)).collect();
    let held: std::collections::HashSet<String> =
        records.iter().filter(|(_, _, live, _)| *live).map(|(_, _, _, c)| c.target()).collect();
    let mut out = Vec::new();
    for (path, pid, live, change) in records {
        if live || held.contains(&change.target()) {
            continue;
        }
        let outcome = undo(&change);
        if outcome.is_ok() {
            let _ = fs::remove_file(&path);
        }
        out.push(Cleaned { pid, change, outcome });
    }
    Ok(out)
}

/// A change held for as long as this guard lives: recorded before it is made (so
/// `netlane clean` undoes it after a SIGKILL), undone when the guard is dropped unless
/// someone changed the same thing since.
#[derive(Debug)]
pub struct Held {
    change: Change,
    record: Option<Record>,
}

impl Held {
    /// Records `change`, then makes it with `make`; when `make` fails the record goes
    /// and nothing is held.
    pub fn make(change: Change, make: impl FnOnce() -> io::Result<()>) -> io::Result<Held> {
        let record = record(&change)?;
        make()?;
        Ok(Held { change, record: Some(record) })
    }

    /// Says what the change turned out to be (the value as the kernel reads it back,
    /// which may be spelt otherwise than it was written), in the record too.
    pub fn amend(&mut self, change: Change) -> io::Result<()> {
        if let Some(r) = &self.record {
            r.rewrite(&change)?;
        }
        self.change = change;
        Ok(())
    }

    /// Keeps the change for good: its record goes, nothing is undone.
    pub fn release(mut self) {
        self.record.take();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(record) = self.record.take() else { return };
        match undo(&self.change) {
            Ok(_) => drop(record),
            Err(e) => {
                tracing::warn!(change = %self.change, error = %e, "could not undo a change (netlane clean will)");
                record.keep();
            }
        }
    }
}

/// A sysctl set for as long as this guard lives (recorded, so `netlane clean` restores
/// it after a SIGKILL), then set back, unless someone changed it since.
#[derive(Debug)]
pub struct Sysctl {
    path: PathBuf,
    before: String,
    value: String,
    record: Option<Record>,
}

impl Sysctl {
    /// Sets the sysctl at `path` (under /proc/sys) to `value`, in the calling thread's
    /// network namespace. Recorded even when it already had that value: a process that
    /// relies on it holds it, so `netlane clean` leaves it alone meanwhile.
    pub fn set(path: impl Into<PathBuf>, value: &str) -> io::Result<Sysctl> {
        let path = path.into();
        let before = fs::read_to_string(&path)?.trim().to_string();
        let value = value.trim().to_string();
        let place = Place::here()?;
        let change = Change::Sysctl { place, path: path.clone(), before: before.clone(), value: value.clone() };
        let record = record(&change)?;
        if before != value {
            fs::write(&path, &value)?;
        }
        Ok(Sysctl { path, before, value, record: Some(record) })
    }

    /// The value it has now.
    pub fn read(&self) -> io::Result<String> {
        Ok(fs::read_to_string(&self.path)?.trim().to_string())
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if self.before == self.value {
            return;
        }
        let now = fs::read_to_string(&self.path).unwrap_or_default();
        if now.trim() == self.value
            && let Err(e) = fs::write(&self.path, &self.before)
        {
            tracing::warn!(sysctl = %sysctl_name(&self.path), error = %e, "could not restore a sysctl (netlane clean will)");
            if let Some(r) = self.record.take() {
                r.keep();
            }
        }
    }
}

#[cfg(test)]
mod tests;
