//! The process-wide list of namespaces this process created, so a Ctrl-C handler can
//! remove them before exiting, and the removal of namespaces left behind by netlane
//! processes that no longer exist (killed with SIGKILL, or crashed).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::mount::{MntFlags, umount2};

use super::netns::{NAME_PREFIX, NETNS_RUN_DIR};

static LIVE: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

pub(crate) fn register(path: &Path) {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).insert(path.to_path_buf());
}

pub(crate) fn unregister(path: &Path) {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).remove(path);
}

fn remove(path: &Path) -> bool {
    let unmounted = umount2(path, MntFlags::MNT_DETACH).is_ok();
    let removed = fs::remove_file(path).is_ok();
    unmounted || removed
}

/// Removes every namespace this process still holds (for signal handlers, which
/// cannot rely on destructors running). Returns how many were removed. The guards
/// that still own them then find nothing to remove, which they tolerate.
pub fn cleanup_all() -> usize {
    let paths: Vec<PathBuf> =
        std::mem::take(&mut *LIVE.lock().unwrap_or_else(|p| p.into_inner())).into_iter().collect();
    paths.iter().filter(|p| remove(p)).count()
}

/// Names of namespaces this process holds right now.
pub fn live() -> Vec<String> {
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

/// The creating process id encoded in a netlane namespace name, if it is one.
pub fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(NAME_PREFIX)?.split('-').next()?.parse().ok()
}

/// What [`clean_stale`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Namespaces removed.
    pub namespaces: Vec<String>,
    /// Processes that were still running inside them and were ended: (pid, command
    /// name, namespace).
    pub processes: Vec<(u32, String, String)>,
}

/// Removes netlane namespaces (`nl-<pid>-...`) whose creating process is gone, ending
/// first any process still running inside one (a server a killed run started: it
/// would keep the namespace, and whatever it holds, alive): SIGTERM, then SIGKILL
/// after a second. Namespaces of live processes are left alone.
pub fn clean_stale() -> std::io::Result<Cleaned> {
    let mut cleaned = Cleaned::default();
    let entries = match fs::read_dir(NETNS_RUN_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(cleaned),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        for (p, comm) in end_processes_in(&entry.path()) {
            cleaned.processes.push((p, comm, name.clone()));
        }
        if remove(&entry.path()) {
            cleaned.namespaces.push(name);
        }
    }
    Ok(cleaned)
}

/// Processes whose network namespace is the one bound at `ns` (same nsfs inode).
pub(super) fn processes_in(ns: &Path) -> Vec<(u32, String)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(target) = fs::metadata(ns) else { return Vec::new() };
    let own = std::process::id();
    let Ok(procs) = fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != own)
        .filter(|p| {
            fs::metadata(format!("/proc/{p}/ns/net")).is_ok_and(|m| m.ino() == target.ino() && m.dev() == target.dev())
        })
        .map(|p| (p, fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default().trim().to_string()))
        .collect()
}

/// Ends the processes inside the namespace at `ns`; returns them.
pub(super) fn end_processes_in(ns: &Path) -> Vec<(u32, String)> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let found = processes_in(ns);
    for (p, _) in &found {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGTERM);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !processes_in(ns).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for (p, _) in processes_in(ns) {
        let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_only_netlane_names() {
        assert_eq!(owner_pid("nl-1234-0-tx"), Some(1234));
        assert_eq!(owner_pid("nl-x-0-tx"), None);
        assert_eq!(owner_pid("pA"), None);
    }
}
