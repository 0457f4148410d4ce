//! The supervisor: one way for every server to run until it should end.
//!
//! A server that runs on threads of its own ([`Running`]) is watched from the thread
//! that started it until a stop is given (at once: the wait is on the [`Stop`]'s
//! eventfd), its time is up, or the server itself says it ended (a thread failed, a
//! client asked for a shutdown); then it is stopped and its final counters returned.

use std::time::{Duration, Instant};

use super::Stop;

/// How often a running server is asked whether it ended by itself: the most a failed
/// thread or the end of the time goes unnoticed. A stop is never late.
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// Why a server ended by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// One of its threads stopped unexpectedly (what it said is in the log).
    Failed(String),
    /// It was asked to (memcached's `shutdown` command): a normal end.
    Asked(String),
}

/// Why supervision ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The stop signal was given.
    Stopped,
    /// Its time was up.
    TimeUp,
    /// It ended by itself.
    Ended(Ended),
}

/// A server running on threads of its own.
pub trait Running {
    /// What it returns when stopped: its final counters.
    type Final;

    /// Whether it ended by itself (checked every [`CHECK_EVERY`]).
    fn poll_ended(&self) -> Option<Ended>;

    /// Stops every thread and returns the final counters.
    fn stop(self) -> Self::Final;
}

/// Watches `server` until `stop` is given, `time` has passed (when given), or the
/// server ends by itself; then stops it. Returns why, and its final counters.
pub fn supervise<R: Running>(server: R, stop: &Stop, time: Option<Duration>) -> (Outcome, R::Final) {
    supervise_ticking(server, stop, time, None, |_, _| {})
}

/// [`supervise`], calling `tick` with the server and the time since it started every
/// `every` (when given) while it runs: a periodic line of its rates.
pub fn supervise_ticking<R: Running>(
    server: R,
    stop: &Stop,
    time: Option<Duration>,
    every: Option<Duration>,
    mut tick: impl FnMut(&R, Duration),
) -> (Outcome, R::Final) {
    let started = Instant::now();
    let mut next = every.map(|e| started + e);
    let outcome = loop {
        if let Some(e) = server.poll_ended() {
            break Outcome::Ended(e);
        }
        if let (Some(at), Some(e)) = (next, every)
            && Instant::now() >= at
        {
            tick(&server, started.elapsed());
            next = Some(at + e);
        }
        let left = time.map(|t| t.saturating_sub(started.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            break Outcome::TimeUp;
        }
        if stop.wait(left.map_or(CHECK_EVERY, |l| l.min(CHECK_EVERY))) {
            break Outcome::Stopped;
        }
    };
    (outcome, server.stop())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct Fake {
        failed: Arc<AtomicBool>,
    }

    impl Running for Fake {
        type Final = &'static str;

        fn poll_ended(&self) -> Option<Ended> {
            self.failed.load(Ordering::Relaxed).then(|| Ended::Failed("worker 2".into()))
        }

        fn stop(self) -> &'static str {
            "final counters"
        }
    }

    #[test]
    fn ends_on_a_stop_at_once_on_its_time_and_on_a_failed_thread() {
        let failed = Arc::new(AtomicBool::new(false));
        let stop = Stop::new().unwrap();
        let (outcome, fin) = supervise(Fake { failed: failed.clone() }, &stop, Some(Duration::from_millis(30)));
        assert_eq!((outcome, fin), (Outcome::TimeUp, "final counters"));
        failed.store(true, Ordering::Relaxed);
        let (outcome, _) = supervise(Fake { failed: failed.clone() }, &stop, None);
        assert_eq!(outcome, Outcome::Ended(Ended::Failed("worker 2".into())));
        failed.store(false, Ordering::Relaxed);
        let giver = stop.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            giver.stop();
        });
        let (outcome, _) = supervise(Fake { failed }, &stop, None);
        t.join().unwrap();
        assert_eq!(outcome, Outcome::Stopped);
    }
}
