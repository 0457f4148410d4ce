//! What netlane changes in the kernel that would outlive the process that changed it: a
//! root qdisc on a device, a cgroup, a sysctl. Each change is recorded in a file under
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

/// Where records live (tmpfs: a reboot undoes every change anyway).
pub const DIR: &str = "/run/netlane/installed";

/// One change to the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// A root qdisc of kind `qdisc` on device `ifname` (index `ifindex`).
    RootQdisc {
        /// The network namespace: its name under /run/netns, if it has one.
        netns: Option<String>,
        /// The namespace's inode, to tell it without a name.
        netns_inode: u64,
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
    /// A sysctl set to `value`; it was `before`.
    Sysctl {
        /// Its path under /proc/sys.
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
            Change::RootQdisc { netns, ifname, qdisc, .. } => {
                write!(f, "{qdisc} root qdisc on {ifname}")?;
                match netns {
                    Some(n) => write!(f, " (namespace {n})"),
                    None => Ok(()),
                }
            }
            Change::Cgroup { path } => write!(f, "cgroup {}", path.display()),
            Change::Sysctl { path, before, value } => {
                write!(f, "sysctl {} = {value} (was {before})", sysctl_name(path))
            }
        }
    }
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

fn record_in(dir: &Path, change: &Change) -> io::Result<Record> {
    fs::create_dir_all(dir)?;
    let name = format!("{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
    let path = dir.join(format!("{name}.json"));
    let tmp = dir.join(format!(".{name}.tmp"));
    let text = serde_json::to_string(change).map_err(io::Error::other)?;
    fs::write(&tmp, text)?;
    fs::rename(&tmp, &path)?;
    Ok(Record { path })
}

/// The current network namespace's name under /run/netns (if one is bound there) and
/// its inode.
pub fn current_netns() -> io::Result<(Option<String>, u64)> {
    let inode = fs::metadata("/proc/thread-self/ns/net")?.ino();
    let named = fs::read_dir(crate::topology::NETNS_RUN_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| fs::metadata(e.path()).is_ok_and(|m| m.ino() == inode))
        .map(|e| e.file_name().to_string_lossy().into_owned());
    Ok((named, inode))
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

/// Undoes the recorded changes of processes that no longer exist, and removes their
/// records; a change that cannot be undone here keeps its record and says why.
pub fn clean_stale() -> io::Result<Vec<Cleaned>> {
    clean_stale_in(Path::new(DIR))
}

fn clean_stale_in(dir: &Path) -> io::Result<Vec<Cleaned>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        let Some(pid) = stem.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let change = match fs::read_to_string(&path).map(|t| serde_json::from_str::<Change>(&t)) {
            Ok(Ok(c)) => c,
            // Not a record netlane wrote (or one from another version): left alone.
            _ => continue,
        };
        let outcome = undo(&change);
        if outcome.is_ok() {
            let _ = fs::remove_file(&path);
        }
        out.push(Cleaned { pid, change, outcome });
    }
    Ok(out)
}

/// Undoes one change, unless someone changed the same thing since.
fn undo(change: &Change) -> Result<String, String> {
    match change {
        Change::RootQdisc { netns, netns_inode, ifindex, ifname, qdisc } => {
            let remove = || -> Result<String, String> {
                let mut r = crate::topology::Rtnl::open().map_err(|e| format!("open rtnetlink: {e}"))?;
                let name = r.link_name(*ifindex).ok();
                if name.as_deref() != Some(ifname.as_str()) {
                    return Ok(format!("{ifname} is gone"));
                }
                match r.root_qdisc(*ifindex).map_err(|e| format!("read {ifname}'s root qdisc: {e}"))? {
                    Some((kind, _)) if kind == *qdisc => {
                        r.del_root_qdisc(*ifindex).map_err(|e| format!("remove it: {e}"))?;
                        Ok("removed".into())
                    }
                    Some((kind, _)) => Ok(format!("left alone: {ifname}'s root qdisc is {kind} now")),
                    None => Ok("already gone".into()),
                }
            };
            match netns {
                Some(name) if Path::new(crate::topology::NETNS_RUN_DIR).join(name).exists() => {
                    crate::topology::run_in_named(name, remove).map_err(|e| e.to_string())?
                }
                Some(_) => Ok("gone with its namespace".into()),
                None => {
                    let here = fs::metadata("/proc/thread-self/ns/net").map(|m| m.ino()).map_err(|e| e.to_string())?;
                    if here == *netns_inode {
                        remove()
                    } else {
                        Err("installed in another network namespace: run netlane clean there".into())
                    }
                }
            }
        }
        Change::Cgroup { path } => {
            if !path.exists() {
                return Ok("already gone".into());
            }
            let ended = end_processes(path);
            remove_cgroup(path).map_err(|e| format!("remove it: {e}"))?;
            Ok(if ended.is_empty() { "removed".into() } else { format!("ended {}, then removed it", ended.join(", ")) })
        }
        Change::Sysctl { path, before, value } => {
            let now = fs::read_to_string(path).map_err(|e| format!("read it: {e}"))?;
            if now.trim() != value.trim() {
                return Ok(format!("left alone: it is {} now", now.trim()));
            }
            fs::write(path, before).map_err(|e| format!("restore it: {e}"))?;
            Ok(format!("restored to {before}"))
        }
    }
}

/// Ends the processes in cgroup `path` (SIGTERM, SIGKILL after a second); returns them
/// as `name (pid N)`.
fn end_processes(path: &Path) -> Vec<String> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let procs = || -> Vec<i32> {
        fs::read_to_string(path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let found: Vec<String> = procs()
        .into_iter()
        .map(|p| {
            let comm = fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            format!("{} (pid {p})", comm.trim())
        })
        .collect();
    for p in procs() {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !procs().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for p in procs() {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    found
}

/// Removes a cgroup directory, waiting up to a second for exiting processes to leave.
pub(crate) fn remove_cgroup(path: &Path) -> io::Result<()> {
    let mut tries = 0;
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
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
    _record: Option<Record>,
}

impl Sysctl {
    /// Sets the sysctl at `path` (under /proc/sys) to `value`. Nothing is recorded or
    /// restored when it already had that value.
    pub fn set(path: impl Into<PathBuf>, value: &str) -> io::Result<Sysctl> {
        let path = path.into();
        let before = fs::read_to_string(&path)?.trim().to_string();
        let value = value.trim().to_string();
        if before == value {
            return Ok(Sysctl { path, before, value, _record: None });
        }
        let record = record(&Change::Sysctl { path: path.clone(), before: before.clone(), value: value.clone() })?;
        fs::write(&path, &value)?;
        Ok(Sysctl { path, before, value, _record: Some(record) })
    }

    /// The value it has now.
    pub fn read(&self) -> io::Result<String> {
        Ok(fs::read_to_string(&self.path)?.trim().to_string())
    }

    /// The value it had before.
    pub fn before(&self) -> &str {
        &self.before
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if self._record.is_none() {
            return;
        }
        let now = fs::read_to_string(&self.path).unwrap_or_default();
        if now.trim() == self.value
            && let Err(e) = fs::write(&self.path, &self.before)
        {
            tracing::warn!(sysctl = %sysctl_name(&self.path), error = %e, "could not restore a sysctl");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("netlane-installed-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn records_of_live_processes_stay_and_dead_ones_are_undone() {
        let d = dir("records");
        let value = d.join("value");
        fs::create_dir_all(&d).unwrap();
        fs::write(&value, "1\n").unwrap();
        let change = Change::Sysctl { path: value.clone(), before: "0".into(), value: "1".into() };
        // Ours (alive): a clean leaves it; dropping the record removes it.
        let mine = record_in(&d, &change).unwrap();
        assert!(clean_stale_in(&d).unwrap().is_empty());
        drop(mine);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1, "only the value file is left");
        // A dead process's (pid 2^22 + 1 is above the kernel's limit): undone and removed.
        let text = serde_json::to_string(&change).unwrap();
        fs::write(d.join("4194305-0.json"), text).unwrap();
        let cleaned = clean_stale_in(&d).unwrap();
        assert_eq!(cleaned.len(), 1);
        assert_eq!(cleaned[0].pid, 4_194_305);
        assert_eq!(cleaned[0].outcome, Ok("restored to 0".into()));
        assert_eq!(fs::read_to_string(&value).unwrap(), "0");
        assert!(!d.join("4194305-0.json").exists());
        // A value someone changed since is left alone; files that are not records too.
        fs::write(&value, "7").unwrap();
        fs::write(d.join("4194305-1.json"), serde_json::to_string(&change).unwrap()).unwrap();
        fs::write(d.join("4194305-2.json"), "not json").unwrap();
        let cleaned = clean_stale_in(&d).unwrap();
        assert_eq!(cleaned[0].outcome, Ok("left alone: it is 7 now".into()));
        assert_eq!(fs::read_to_string(&value).unwrap(), "7");
        assert!(d.join("4194305-2.json").exists());
        let _ = fs::remove_dir_all(&d);
    }
}
