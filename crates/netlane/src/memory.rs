//! Memory a server asks for, checked against what the machine has before it takes any.
//!
//! A server that builds a 64 GiB namespace on a 24 GiB machine does not fail: it runs
//! until the OOM killer ends it, or another process. So every server adds up what its
//! configuration may take (an [`Ask`]: namespaces, caches, buffers at their bounds) and
//! checks it against [`available`] first: the kernel's estimate of memory it can give
//! without swapping (`MemAvailable`), and the room left under every memory cgroup limit
//! above this process (v1 and v2), whichever is smaller.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// What limits the memory a process can take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    /// The kernel's `MemAvailable` (`/proc/meminfo`).
    MemAvailable,
    /// A memory cgroup's limit (its directory).
    Cgroup(PathBuf),
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::MemAvailable => f.write_str("MemAvailable"),
            Limit::Cgroup(p) => write!(f, "the limit of cgroup {}", p.display()),
        }
    }
}

/// Memory this process can still take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// What sets it.
    pub limit: Limit,
}

/// Reading what the machine has failed, or an ask is larger.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// An ask is larger than what is available.
    #[error("{asked} of memory asked for ({parts}), more than the {available} this machine has available ({limit})",
        asked = human(*.asked), available = human(.available.bytes), limit = .available.limit)]
    TooMuch {
        /// The total asked for.
        asked: u64,
        /// Its parts, `what: size` joined.
        parts: String,
        /// What there is.
        available: Available,
    },
    /// `/proc/meminfo` could not be read or has no `MemAvailable`.
    #[error("reading /proc/meminfo")]
    Meminfo(#[source] io::Error),
}

/// The parts of what a server's configuration may take, each named, in bytes.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    parts: Vec<(String, u64)>,
}

impl Ask {
    /// An empty ask.
    pub fn new() -> Ask {
        Ask::default()
    }

    /// Adds `bytes` for `what` (a phrase: "namespace 1", "1024 connections x 4M").
    pub fn add(mut self, what: impl Into<String>, bytes: u64) -> Ask {
        if bytes > 0 {
            self.parts.push((what.into(), bytes));
        }
        self
    }

    /// The total, in bytes.
    pub fn total(&self) -> u64 {
        self.parts.iter().fold(0u64, |t, (_, b)| t.saturating_add(*b))
    }

    /// Fails when the total is over `available`.
    pub fn check_against(&self, available: &Available) -> Result<(), MemoryError> {
        let asked = self.total();
        if asked <= available.bytes {
            return Ok(());
        }
        let parts = self.parts.iter().map(|(w, b)| format!("{w}: {}", human(*b))).collect::<Vec<_>>().join(", ");
        Err(MemoryError::TooMuch { asked, parts, available: available.clone() })
    }

    /// Fails when the total is over what this machine has available now.
    pub fn check(&self) -> Result<(), MemoryError> {
        if self.total() == 0 {
            return Ok(());
        }
        self.check_against(&available()?)
    }
}

/// What this process can take now: `MemAvailable`, or less when a memory cgroup above
/// it has less room.
pub fn available() -> Result<Available, MemoryError> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(MemoryError::Meminfo)?;
    let bytes = mem_available(&meminfo)
        .ok_or_else(|| MemoryError::Meminfo(io::Error::new(io::ErrorKind::InvalidData, "no MemAvailable line")))?;
    let mut best = Available { bytes, limit: Limit::MemAvailable };
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for dir in memory_cgroups(&own, Path::new("/sys/fs/cgroup")) {
        if let Some(room) = cgroup_room(&dir)
            && room < best.bytes
        {
            best = Available { bytes: room, limit: Limit::Cgroup(dir) };
        }
    }
    Ok(best)
}

/// `MemAvailable` from the text of `/proc/meminfo`, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The directories of the memory cgroups this process is in and their ancestors, from
/// the text of `/proc/self/cgroup` (`0::/path` for v2, `N:...memory...:/path` for v1).
fn memory_cgroups(own: &str, root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let base = if id == "0" && controllers.is_empty() {
            root.to_path_buf()
        } else if controllers.split(',').any(|c| c == "memory") {
            root.join("memory")
        } else {
            continue;
        };
        let mut dir = base.clone();
        dirs.push(dir.clone());
        for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
            dir.push(part);
            dirs.push(dir.clone());
        }
    }
    dirs
}

/// Room left under the limit of the cgroup at `dir` (None: no limit, or not a memory
/// cgroup): the limit less what is charged, counting inactive page cache as room (the
/// kernel reclaims it before it fails an allocation).
fn cgroup_room(dir: &Path) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let (limit, usage, stat) = match read("memory.max") {
        Some(max) => (max, read("memory.current")?, read("memory.stat").unwrap_or_default()),
        None => {
            (read("memory.limit_in_bytes")?, read("memory.usage_in_bytes")?, read("memory.stat").unwrap_or_default())
        }
    };
    room(&limit, &usage, &stat)
}

fn room(limit: &str, usage: &str, stat: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok()?;
    // v1 says "no limit" with a page-rounded i64::MAX.
    if limit >= 1 << 62 {
        return None;
    }
    let usage: u64 = usage.trim().parse().ok()?;
    let inactive_file = stat
        .lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == "inactive_file" || *k == "total_inactive_file")
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(inactive_file)))
}

/// A size a reader takes in at once: `64.0 GiB`, `300.0 MiB`, `512 KiB`, `100 B`.
pub fn human(bytes: u64) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    if b >= K * K * K {
        format!("{:.1} GiB", b / (K * K * K))
    } else if b >= K * K {
        format!("{:.1} MiB", b / (K * K))
    } else if b >= K {
        format!("{:.0} KiB", b / K)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_reads_the_kib_line() {
        let text = "MemTotal:       24684092 kB\nMemFree:  1 kB\nMemAvailable:   23938844 kB\n";
        assert_eq!(mem_available(text), Some(23_938_844 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn memory_cgroups_walk_v1_and_v2_paths_up_to_the_root() {
        let root = Path::new("/cg");
        let v1 = "9:name=systemd:/\n4:memory:/a/b\n3:cpuset:/\n";
        assert_eq!(
            memory_cgroups(v1, root),
            [PathBuf::from("/cg/memory"), PathBuf::from("/cg/memory/a"), PathBuf::from("/cg/memory/a/b")]
        );
        assert_eq!(
            memory_cgroups("0::/user.slice/x.scope\n", root),
            [PathBuf::from("/cg"), PathBuf::from("/cg/user.slice"), PathBuf::from("/cg/user.slice/x.scope")]
        );
        assert_eq!(memory_cgroups("2:cpu,memory:/\n", root), [PathBuf::from("/cg/memory")]);
        assert!(memory_cgroups("garbage\n1:cpu:/x\n", root).is_empty());
    }

    #[test]
    fn room_is_limit_less_charged_memory_that_cannot_be_reclaimed() {
        assert_eq!(room("max\n", "100\n", ""), None);
        assert_eq!(room("9223372036854771712\n", "100\n", ""), None);
        assert_eq!(room("1000\n", "600\n", "anon 500\ninactive_file 100\n"), Some(500));
        assert_eq!(room("1000\n", "600\n", "total_inactive_file 200\n"), Some(600));
        assert_eq!(room("1000\n", "1600\n", ""), Some(0));
    }

    #[test]
    fn an_ask_over_what_is_available_names_its_parts_and_the_limit() {
        let avail = Available { bytes: 23 << 30, limit: Limit::MemAvailable };
        let ask = Ask::new().add("namespace 1", 64 << 30).add("nothing", 0).add("1024 queues x 4M", 4 << 30);
        assert_eq!(ask.total(), 68 << 30);
        let e = ask.check_against(&avail).unwrap_err().to_string();
        assert_eq!(
            e,
            "68.0 GiB of memory asked for (namespace 1: 64.0 GiB, 1024 queues x 4M: 4.0 GiB), more than the 23.0 GiB \
             this machine has available (MemAvailable)"
        );
        assert!(Ask::new().add("cache", 1 << 30).check_against(&avail).is_ok());
        let cg = Available { bytes: 1 << 20, limit: Limit::Cgroup("/sys/fs/cgroup/x".into()) };
        let e = Ask::new().add("cache", 2 << 20).check_against(&cg).unwrap_err().to_string();
        assert!(e.ends_with("(the limit of cgroup /sys/fs/cgroup/x)"), "{e}");
    }

    #[test]
    fn this_machine_has_some_memory_available() {
        let a = available().unwrap();
        assert!(a.bytes > 0);
        assert!(Ask::new().add("everything", u64::MAX).check().is_err());
    }
}
