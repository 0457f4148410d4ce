//! What an acceptor does when `accept` fails: waits, longer each time, and says so at a
//! limited rate.
//!
//! EMFILE, ENFILE, ENOBUFS and ENOMEM leave the pending connection queued and the
//! listener readable: an acceptor that tried again at once would spin on it. It waits
//! 10 ms, doubling to 1 s while the failures go on, and starts again from nothing at the
//! next connection taken. It never sleeps: the caller waits (on its [`super::Stop`], so
//! that a stop still ends the wait).

use std::io;
use std::time::{Duration, Instant};

use crate::ratelimit::RateLimit;

/// The first wait after a failed accept.
pub const FIRST_WAIT: Duration = Duration::from_millis(10);
/// The longest wait.
pub const LONGEST_WAIT: Duration = Duration::from_secs(1);
/// At most one log line per this interval about failed accepts.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// An acceptor's backoff after failed accepts.
#[derive(Debug, Clone)]
pub struct AcceptBackoff {
    wait: Duration,
    log: RateLimit,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff::new()
    }
}

impl AcceptBackoff {
    /// No failure yet.
    pub fn new() -> AcceptBackoff {
        AcceptBackoff { wait: Duration::ZERO, log: RateLimit::new(LOG_EVERY) }
    }

    /// A connection was taken: the failures are over.
    pub fn handle_accepted(&mut self) {
        self.wait = Duration::ZERO;
    }

    /// `accept` failed with `e` at `now` (not `WouldBlock` or `Interrupted`, which are
    /// no failure): how long to wait before the next try. Logged at most once per 10 s,
    /// with how many failures were held back.
    pub fn handle_error(&mut self, e: &io::Error, now: Instant) -> Duration {
        self.wait = (self.wait * 2).clamp(FIRST_WAIT, LONGEST_WAIT);
        if let Some(held_back) = self.log.allow(now) {
            tracing::warn!(also_failed = held_back, retry_in = ?self.wait, "accept: {e}");
        }
        self.wait
    }

    /// The wait the last failure asked for (zero after a connection was taken).
    pub fn poll_wait(&self) -> Duration {
        self.wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_a_second_and_end_with_the_next_connection() {
        let mut b = AcceptBackoff::new();
        let e = io::Error::from_raw_os_error(24);
        let now = Instant::now();
        let waits: Vec<u128> = (0..9).map(|_| b.handle_error(&e, now).as_millis()).collect();
        assert_eq!(waits, vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.handle_accepted();
        assert_eq!(b.poll_wait(), Duration::ZERO);
        assert_eq!(b.handle_error(&e, now), FIRST_WAIT);
    }
}
