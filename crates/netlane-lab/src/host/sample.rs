//! A role's resident memory and open descriptors, sampled on the machine it runs on:
//! from this process for a local role, by its supervisor for a remote one (which writes
//! each sample as a line of standard error that the lab takes out of the role's output).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What begins a sample's line.
pub const SAMPLE: &str = "netlane role sample: ";

/// The samples a role keeps at most; past it every other one goes (the whole run stays
/// covered, at half the resolution).
const KEPT: usize = 20_000;

/// A role's resident memory and open descriptors at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleSample {
    /// Since the sampling started (the role's start).
    pub at: Duration,
    /// Resident memory, bytes.
    pub rss: u64,
    /// Open file descriptors.
    pub fds: u64,
}

impl RoleSample {
    /// Process `pid`'s, from /proc (`None` once it is gone).
    pub fn read(pid: u32, at: Duration) -> Option<RoleSample> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss_kib: u64 =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(RoleSample { at, rss: rss_kib * 1024, fds })
    }

    /// As a supervisor writes it: `netlane role sample: MS RSS FDS`.
    pub fn line(&self) -> String {
        format!("{SAMPLE}{} {} {}", self.at.as_millis(), self.rss, self.fds)
    }

    /// The sample in `line`, where it has one: a role's own unfinished line may precede
    /// it, which is returned too (empty when there was none).
    pub fn parse(line: &str) -> Option<(RoleSample, &str)> {
        let at = line.find(SAMPLE)?;
        let mut w = line[at + SAMPLE.len()..].split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(ms)), Some(Ok(rss)), Some(Ok(fds)), None) = (w.next(), w.next(), w.next(), w.next()) else {
            return None;
        };
        Some((RoleSample { at: Duration::from_millis(ms), rss, fds }, &line[..at]))
    }
}

/// A role's samples, shared with whatever takes them.
#[derive(Debug, Clone, Default)]
pub struct Samples(Arc<Mutex<Vec<RoleSample>>>);

impl Samples {
    /// Adds one (bounded: see [`KEPT`]).
    pub fn push(&self, s: RoleSample) {
        let mut v = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if v.len() >= KEPT {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                i % 2 == 1
            });
        }
        v.push(s);
    }

    /// Those taken so far.
    pub fn all(&self) -> Vec<RoleSample> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Samples process `pid` every `every` on a thread of its own, until it is gone or
    /// `keep_going` says stop.
    pub fn watch(&self, pid: u32, every: Duration, keep_going: impl Fn() -> bool + Send + 'static) {
        let store = Arc::downgrade(&self.0);
        std::thread::spawn(move || {
            let start = Instant::now();
            while keep_going() {
                let Some(s) = RoleSample::read(pid, start.elapsed()) else { break };
                let Some(store) = store.upgrade() else { break };
                Samples(store).push(s);
                std::thread::sleep(every);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_line_is_read_back_even_after_a_roles_unfinished_line() {
        let s = RoleSample { at: Duration::from_millis(1500), rss: 4096 * 1024, fds: 17 };
        assert_eq!(RoleSample::parse(&s.line()), Some((s, "")));
        let joined = format!("half a log line{}", s.line());
        assert_eq!(RoleSample::parse(&joined), Some((s, "half a log line")));
        for bad in ["netlane role sample: 1 2", "netlane role sample: 1 2 3 4", "netlane role sample: a 2 3", "x"] {
            assert_eq!(RoleSample::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn this_process_samples_itself_and_the_store_stays_bounded() {
        let me = RoleSample::read(std::process::id(), Duration::ZERO).unwrap();
        assert!(me.rss > 0 && me.fds >= 3, "{me:?}");
        let store = Samples::default();
        for i in 0..KEPT as u64 + 1 {
            store.push(RoleSample { at: Duration::from_millis(i), rss: i, fds: 0 });
        }
        let all = store.all();
        assert!(all.len() <= KEPT / 2 + 1, "{}", all.len());
        assert_eq!((all[0].rss, all.last().unwrap().rss), (0, KEPT as u64), "the whole run stays covered");
    }
}
