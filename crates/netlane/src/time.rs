//! The monotonic clock in nanoseconds, and sleeping until an absolute deadline.
//!
//! Pacing uses absolute deadlines (`clock_nanosleep(TIMER_ABSTIME)`), so time spent
//! between wake-ups never accumulates as drift.

use nix::sys::time::TimeSpec;
use nix::time::{ClockId, ClockNanosleepFlags, clock_gettime, clock_nanosleep};

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux (clock_gettime(2): EINVAL only for unknown
    // clocks); fall back to zero rather than panic.
    clock_gettime(ClockId::CLOCK_MONOTONIC).map(to_ns).unwrap_or(0)
}

fn to_ns(ts: TimeSpec) -> u64 {
    (ts.tv_sec() as u64) * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `deadline_ns` (returns at once if it has).
pub fn sleep_until(deadline_ns: u64) {
    let ts = TimeSpec::new((deadline_ns / 1_000_000_000) as _, (deadline_ns % 1_000_000_000) as _);
    loop {
        match clock_nanosleep(ClockId::CLOCK_MONOTONIC, ClockNanosleepFlags::TIMER_ABSTIME, &ts) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_until_an_absolute_deadline() {
        let t0 = monotonic_ns();
        sleep_until(t0 + 2_000_000);
        assert!(monotonic_ns() >= t0 + 2_000_000);
        // A deadline in the past returns at once.
        sleep_until(t0);
    }
}
