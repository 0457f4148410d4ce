//! Where a load generator's run is, for a live status line (`nvme perf`, `kv load`,
//! `rr clients`): reported every [`STATUS_EVERY`] by the thread that waits for the run.

use std::time::Duration;

/// How often a run reports its status.
pub const STATUS_EVERY: Duration = Duration::from_millis(500);

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunStatus {
    /// Since the load started.
    pub elapsed: Duration,
    /// Ramp plus measured time.
    pub total: Duration,
    /// In the measured window (else ramping up).
    pub measuring: bool,
    /// Operations completed so far (commands, requests, responses).
    pub completed: u64,
}

/// The monotonic times of a run, ns: when the load starts, when measuring starts, when
/// it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The load starts.
    pub start_ns: u64,
    /// Measuring starts (after the ramp).
    pub measure_from_ns: u64,
    /// The load ends.
    pub end_ns: u64,
}

/// Waits while `running` says the run's threads do, telling `status` where the run is
/// every [`STATUS_EVERY`] (`completed` is what its threads have counted so far). Checked
/// ten times as often, so the end of a run is not waited on.
pub fn watch(
    window: Window,
    completed: &std::sync::atomic::AtomicU64,
    running: impl Fn() -> bool,
    status: &mut dyn FnMut(&RunStatus),
) {
    let total = Duration::from_nanos(window.end_ns.saturating_sub(window.start_ns));
    let mut next = window.start_ns + STATUS_EVERY.as_nanos() as u64;
    while running() {
        std::thread::sleep(STATUS_EVERY / 10);
        let now = crate::time::monotonic_ns();
        if now >= next {
            next = now + STATUS_EVERY.as_nanos() as u64;
            status(&RunStatus {
                elapsed: Duration::from_nanos(now.saturating_sub(window.start_ns)),
                total,
                measuring: now >= window.measure_from_ns,
                completed: completed.load(std::sync::atomic::Ordering::Relaxed),
            });
        }
    }
}
