//! CPUs: one list syntax for every option that names CPUs, pinning threads, and how
//! many CPUs the machine has.
//!
//! The list syntax is the kernel's own (`cpuset(7)`, `/sys/devices/system/cpu/online`):
//! comma-separated numbers and inclusive ranges, `0-3,5`. It is used by every command
//! and in NVMe job groups.
//!
//! CPU counts are read from sysfs, not from `available_parallelism()`: that one honours
//! the calling thread's affinity, so a thread pinned to one CPU would see a one-CPU
//! machine (and size per-CPU state for one CPU).

pub mod machine;

use std::fmt;
use std::str::FromStr;

/// A set of CPU numbers in ascending order, without duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct CpuList(Vec<usize>);

/// A CPU list that could not be parsed or does not fit this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CPU list {input:?}: {reason}")]
pub struct CpuListError {
    input: String,
    reason: String,
}

/// The largest CPU number a list may name (the kernel's NR_CPUS is at most 8192).
const MAX_CPU: usize = 8191;

impl CpuList {
    /// A list of these CPUs (sorted, duplicates removed).
    pub fn new(mut cpus: Vec<usize>) -> CpuList {
        cpus.sort_unstable();
        cpus.dedup();
        CpuList(cpus)
    }

    /// One CPU.
    pub fn one(cpu: usize) -> CpuList {
        CpuList(vec![cpu])
    }

    /// Every online CPU.
    pub fn online() -> CpuList {
        CpuList((0..online_count()).collect())
    }

    /// The CPUs, ascending.
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }

    /// Number of CPUs in the list.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list is empty (a parsed list never is).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `i`-th CPU, wrapping around (job `i` of a group pinned to this list).
    pub fn nth_wrapping(&self, i: usize) -> Option<usize> {
        (!self.0.is_empty()).then(|| self.0[i % self.0.len()])
    }

    /// Fails with the first CPU that this machine does not have online.
    pub fn check_online(&self) -> Result<(), CpuListError> {
        let n = online_count();
        match self.0.iter().find(|&&c| c >= n) {
            Some(bad) => Err(CpuListError {
                input: self.to_string(),
                reason: format!("CPU {bad} does not exist (this machine has CPUs {})", CpuList::online()),
            }),
            None => Ok(()),
        }
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;

    fn from_str(s: &str) -> Result<CpuList, CpuListError> {
        let err = |reason: String| CpuListError { input: s.to_string(), reason };
        let num = |t: &str| -> Result<usize, CpuListError> {
            let v: usize = t.trim().parse().map_err(|_| err(format!("{t:?} is not a CPU number")))?;
            if v > MAX_CPU {
                return Err(err(format!("CPU {v} is above {MAX_CPU}")));
            }
            Ok(v)
        };
        let mut cpus = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(err("empty entry (write CPUs like 0-3,5)".into()));
            }
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(err(format!("range {part:?} runs backwards")));
                    }
                    cpus.extend(a..=b);
                }
                None => cpus.push(num(part)?),
            }
        }
        Ok(CpuList::new(cpus))
    }
}

impl fmt::Display for CpuList {
    /// Ranges where the list has them: `0-3,5` (parses back to the same list).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut first = true;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end > start {
                write!(f, "{start}-{end}")?
            } else {
                write!(f, "{start}")?
            }
            i += 1;
        }
        Ok(())
    }
}

impl From<CpuList> for String {
    fn from(c: CpuList) -> String {
        c.to_string()
    }
}

impl TryFrom<String> for CpuList {
    type Error = CpuListError;
    fn try_from(s: String) -> Result<CpuList, CpuListError> {
        s.parse()
    }
}

/// Parses a CPU list, not checked against this machine's CPUs: for a list another
/// machine uses (clap's `value_parser`).
pub fn parse_list(s: &str) -> Result<CpuList, String> {
    s.parse().map_err(|e: CpuListError| e.to_string())
}

/// Parses a CPU list and checks it against the CPUs online here (for clap's
/// `value_parser`).
pub fn parse_online(s: &str) -> Result<CpuList, String> {
    let l: CpuList = s.parse().map_err(|e: CpuListError| e.to_string())?;
    l.check_online().map_err(|e| e.to_string())?;
    Ok(l)
}

/// Counts the CPUs in a sysfs list file's text (`0-1`, `0,2-3`).
fn count_in(text: &str) -> Option<usize> {
    text.trim().parse::<CpuList>().ok().and_then(|l| l.as_slice().last().map(|c| c + 1))
}

/// CPUs online (one more than the highest online CPU number), whatever the calling
/// thread's affinity.
pub fn online_count() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| count_in(&t))
        .or_else(|| nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN).ok().flatten().map(|n| n as usize))
        .unwrap_or(1)
        .max(1)
}

/// CPUs the kernel can ever bring up: the number of slots per-CPU BPF maps and the
/// per-CPU LRU lists have.
pub fn possible_count() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|t| count_in(&t))
        .unwrap_or_else(online_count)
}

/// The size in bytes of the largest cache CPU `cpu` has (its last level), from sysfs:
/// `None` where the kernel does not say.
pub fn last_level_cache_bytes(cpu: usize) -> Option<u64> {
    let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cache");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let level: u32 = read(e.path().join("level"))?.trim().parse().ok()?;
            Some((level, cache_size(&read(e.path().join("size"))?)?))
        })
        .max()
        .map(|(_, bytes)| bytes)
}

/// A sysfs cache size ("32768K", "1M", "512") in bytes.
fn cache_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// Pins the calling thread to `cpu` (nothing for `None`; a warning if the CPU does not
/// exist or the call fails).
pub fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let mut set = nix::sched::CpuSet::new();
        if set.set(cpu).is_ok()
            && let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        {
            tracing::warn!(cpu, error = %e, "could not pin thread");
        }
    }
}

/// Pins process or thread `pid` to `cpu` (a child just started, say).
pub fn pin_pid(pid: u32, cpu: usize) -> Result<(), nix::Error> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &set)
}

/// The CPU the calling thread runs on now.
pub fn current() -> usize {
    nix::sched::sched_getcpu().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(cache_size("1M"), Some(1 << 20));
        assert_eq!(cache_size("512"), Some(512));
        for bad in ["", "K", "12Q", "-1K", "99999999999999999999G"] {
            assert_eq!(cache_size(bad), None, "{bad}");
        }
        // This machine's, where sysfs has one: at least a first-level cache's size.
        if let Some(b) = last_level_cache_bytes(0) {
            assert!(b >= 4096, "{b}");
        }
    }

    #[test]
    fn lists_parse_and_print_the_kernel_way() {
        let l: CpuList = "0-3,5".parse().unwrap();
        assert_eq!(l.as_slice(), &[0, 1, 2, 3, 5]);
        assert_eq!(l.to_string(), "0-3,5");
        assert_eq!("7,1,1,2".parse::<CpuList>().unwrap().to_string(), "1-2,7");
        assert_eq!("3".parse::<CpuList>().unwrap().to_string(), "3");
        for (bad, why) in
            [("", "empty"), ("1,,2", "empty"), ("3-1", "backwards"), ("a", "not a CPU"), ("99999", "above")]
        {
            let e = bad.parse::<CpuList>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn serde_uses_the_list_syntax() {
        let l: CpuList = "0-2,4".parse().unwrap();
        assert_eq!(serde_json::to_string(&l).unwrap(), "\"0-2,4\"");
        let back: CpuList = serde_json::from_str("\"0-2,4\"").unwrap();
        assert_eq!(back, l);
    }

    #[test]
    fn wrapping_index() {
        let l: CpuList = "2,4".parse().unwrap();
        assert_eq!((l.nth_wrapping(0), l.nth_wrapping(1), l.nth_wrapping(2)), (Some(2), Some(4), Some(2)));
    }

    #[test]
    fn counts_do_not_follow_the_callers_affinity() {
        let all = online_count();
        let seen = std::thread::spawn(move || {
            pin(Some(0));
            (online_count(), possible_count())
        })
        .join()
        .unwrap();
        assert_eq!(seen.0, all, "a thread pinned to CPU 0 still sees every online CPU");
        assert!(seen.1 >= all);
        assert_eq!(count_in("0-1\n"), Some(2));
        assert_eq!(count_in("0,2-3"), Some(4));
    }

    #[test]
    fn machine_check() {
        assert!(CpuList::one(0).check_online().is_ok());
        let e = CpuList::one(8000).check_online().unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}
