//! Rate limiting for log lines a peer can trigger at will (protocol violations, refused
//! connections): at most one per interval, with a count of what was held back, so a
//! hostile or broken peer cannot flood the log.

use std::time::{Duration, Instant};

/// Lets an event through at most once per interval.
#[derive(Debug, Clone)]
pub struct RateLimit {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// One event per `interval`.
    pub fn new(interval: Duration) -> RateLimit {
        RateLimit { interval, last: None, suppressed: 0 }
    }

    /// Whether an event at `now` may be logged: `Some(n)` with the number of events
    /// held back since the last one let through, or `None` to stay quiet.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_with_the_count_held_back() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(Duration::from_secs(1));
        assert_eq!(r.allow(t0), Some(0));
        assert_eq!(r.allow(t0 + Duration::from_millis(10)), None);
        assert_eq!(r.allow(t0 + Duration::from_millis(900)), None);
        assert_eq!(r.allow(t0 + Duration::from_millis(1001)), Some(2));
        assert_eq!(r.allow(t0 + Duration::from_millis(1002)), None);
    }
}
