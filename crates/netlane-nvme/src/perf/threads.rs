//! The CPU a run reads besides its own process's: threads of the kernel's (the NAPI
//! threads towards the target) and a local target's process and threads.

/// Threads counted beside a process, and their CPU seconds over the window (`None`
/// when one could not be read at either end).
#[derive(Debug, Default)]
pub(super) struct KernelThreads {
    pub(super) names: Vec<String>,
    pub(super) cpu_s: Option<f64>,
    /// Times they were put on a CPU over the window.
    pub(super) runs: Option<u64>,
}

impl KernelThreads {
    pub(super) fn over(threads: Vec<(u32, String)>, before: ThreadsRead, after: ThreadsRead) -> KernelThreads {
        let cpu_s = before.cpu_ns.zip(after.cpu_ns).map(|(a, b)| b.saturating_sub(a) as f64 / 1e9);
        let runs = before.runs.zip(after.runs).map(|(a, b)| b.saturating_sub(a));
        KernelThreads { names: threads.into_iter().map(|(pid, name)| format!("{name} ({pid})")).collect(), cpu_s, runs }
    }
}

/// The run time (ns) and runs of every thread of a set so far; `None` if one is
/// unreadable.
#[derive(Debug, Clone, Copy)]
pub(super) struct ThreadsRead {
    cpu_ns: Option<u64>,
    runs: Option<u64>,
}

pub(super) fn read_threads(threads: &[(u32, String)]) -> ThreadsRead {
    let read: Option<Vec<(u64, u64)>> =
        threads.iter().map(|(pid, _)| netlane::metrics::cpu::task_schedstat(*pid).ok()).collect();
    ThreadsRead {
        cpu_ns: read.as_ref().map(|r| r.iter().map(|(ns, _)| ns).sum()),
        runs: read.as_ref().map(|r| r.iter().map(|(_, runs)| runs).sum()),
    }
}

/// A thread's name as the kernel gives it (`comm`), or `?`.
pub(super) fn thread_name(tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{tid}/comm")).map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

pub(super) fn read_proc_cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
