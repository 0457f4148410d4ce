//! Keeps the service from being an amplifier. A request's source address can be forged:
//! a 40-byte request asking for a 64 KiB response would otherwise send 1,600 times its
//! size to whoever the forger names. So, as QUIC does before it has validated an
//! address (RFC 9000 8.1):
//!
//! - a source that has not shown it receives what is sent to it (unverified) gets at
//!   most `ratio` times the bytes of its request, and at most `budget` bytes a second
//!   (a token bucket per source address, with a burst of one second's worth);
//! - past either, it gets a Retry instead: a header-only message no larger than its
//!   request, carrying a cookie (a keyed hash of its address, port and the current
//!   period). A client that receives it sends the request again with the cookie, which
//!   shows it receives what is sent to its address: from then on it is verified and
//!   unlimited, as long as it keeps sending the cookie (one period and the next).
//!
//! A forged source never sees its cookie, so all a flood of forged requests gets is
//! Retries of its own size. Sans-IO: the driver passes the clock in.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};

/// How long a cookie is good for: the period it was made in and the next.
pub const COOKIE_PERIOD_NS: u64 = 60_000_000_000;

/// The guard's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardConfig {
    /// Largest response-to-request ratio (bytes of all response datagrams over the
    /// request datagram's) for an unverified source.
    pub ratio: u32,
    /// Bytes a second an unverified source may be sent (and the burst).
    pub budget: u64,
    /// Most unverified sources tracked at once; past it, new ones get Retries until
    /// idle ones are forgotten.
    pub max_sources: usize,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig { ratio: 3, budget: 64 << 10, max_sources: 65_536 }
    }
}

/// What to do with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send the response.
    Send {
        /// The request carried a valid cookie.
        verified: bool,
    },
    /// Send a Retry carrying this cookie instead.
    Retry(u32),
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u64,
    at_ns: u64,
}

/// The per-source state, and the key cookies are made with.
#[derive(Debug)]
pub struct Guard<S = std::collections::hash_map::RandomState> {
    cfg: GuardConfig,
    keys: S,
    sources: HashMap<IpAddr, Bucket>,
}

impl<S: BuildHasher> Guard<S> {
    /// A guard whose cookies are keyed by `keys` (a `RandomState`: its keys are random
    /// and never leave the process).
    pub fn new(cfg: GuardConfig, keys: S) -> Guard<S> {
        Guard { cfg, keys, sources: HashMap::new() }
    }

    /// The cookie of `from` in period `period`.
    fn cookie_in(&self, from: SocketAddr, period: u64) -> u32 {
        // Never 0: a request without a cookie carries 0.
        (self.keys.hash_one((from, period)) as u32).max(1)
    }

    /// The cookie `from` gets now.
    pub fn cookie(&self, from: SocketAddr, now_ns: u64) -> u32 {
        self.cookie_in(from, now_ns / COOKIE_PERIOD_NS)
    }

    fn valid(&self, from: SocketAddr, cookie: u32, now_ns: u64) -> bool {
        let period = now_ns / COOKIE_PERIOD_NS;
        cookie != 0
            && (cookie == self.cookie_in(from, period)
                || period.checked_sub(1).is_some_and(|p| cookie == self.cookie_in(from, p)))
    }

    /// Decides on a request of `request_bytes` from `from` carrying `cookie` (0: none)
    /// whose response would be `reply_bytes`, at `now_ns`.
    pub fn handle_request(
        &mut self,
        from: SocketAddr,
        cookie: u32,
        request_bytes: usize,
        reply_bytes: usize,
        now_ns: u64,
    ) -> Admit {
        if self.valid(from, cookie, now_ns) {
            return Admit::Send { verified: true };
        }
        let retry = |g: &Self| Admit::Retry(g.cookie(from, now_ns));
        if reply_bytes as u64 > u64::from(self.cfg.ratio).saturating_mul(request_bytes as u64) {
            return retry(self);
        }
        if self.sources.len() >= self.cfg.max_sources && !self.sources.contains_key(&from.ip()) {
            self.forget_idle(now_ns);
            if self.sources.len() >= self.cfg.max_sources {
                return retry(self);
            }
        }
        let budget = self.cfg.budget;
        let b = self.sources.entry(from.ip()).or_insert(Bucket { tokens: budget, at_ns: now_ns });
        let refill = u128::from(now_ns.saturating_sub(b.at_ns)) * u128::from(budget) / 1_000_000_000;
        b.tokens = (u128::from(b.tokens) + refill).min(u128::from(budget)) as u64;
        b.at_ns = now_ns;
        if b.tokens < reply_bytes as u64 {
            return retry(self);
        }
        b.tokens -= reply_bytes as u64;
        Admit::Send { verified: false }
    }

    /// Forgets sources whose bucket has refilled (they have been quiet a second or more).
    fn forget_idle(&mut self, now_ns: u64) {
        self.sources.retain(|_, b| now_ns.saturating_sub(b.at_ns) < 1_000_000_000);
    }

    /// Unverified sources tracked now.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::RandomState;

    fn guard(cfg: GuardConfig) -> Guard {
        Guard::new(cfg, RandomState::new())
    }

    const A: &str = "10.0.0.1:4000";

    #[test]
    fn an_unverified_source_gets_at_most_ratio_times_its_request_then_a_retry() {
        let mut g = guard(GuardConfig::default());
        let a: SocketAddr = A.parse().unwrap();
        assert_eq!(g.handle_request(a, 0, 100, 300, 0), Admit::Send { verified: false });
        let Admit::Retry(cookie) = g.handle_request(a, 0, 40, 65_507, 0) else { panic!("a 1600x response") };
        // The cookie shows the source receives: verified, and unlimited.
        assert_eq!(g.handle_request(a, cookie, 40, 65_507, 1), Admit::Send { verified: true });
        for i in 0..100 {
            assert_eq!(g.handle_request(a, cookie, 40, 65_507, 2 + i), Admit::Send { verified: true });
        }
        // It belongs to that address and port, and to this period and the next.
        let other: SocketAddr = "10.0.0.1:4001".parse().unwrap();
        assert!(matches!(g.handle_request(other, cookie, 40, 65_507, 3), Admit::Retry(c) if c != cookie));
        assert_eq!(g.handle_request(a, cookie, 40, 65_507, 2 * COOKIE_PERIOD_NS - 1), Admit::Send { verified: true });
        assert!(matches!(g.handle_request(a, cookie, 40, 65_507, 2 * COOKIE_PERIOD_NS), Admit::Retry(_)));
        assert!(matches!(g.handle_request(a, 12345, 40, 100, 0), Admit::Send { verified: false }));
    }

    #[test]
    fn an_unverified_source_has_a_byte_budget_a_second() {
        let mut g = guard(GuardConfig { ratio: 3, budget: 10_000, max_sources: 4 });
        let a: SocketAddr = A.parse().unwrap();
        let sent =
            (0..100).filter(|_| g.handle_request(a, 0, 1000, 3000, 0) == Admit::Send { verified: false }).count();
        assert_eq!(sent, 3, "10,000 bytes: three 3,000-byte responses");
        // Half a second refills half.
        let sent = (0..100)
            .filter(|_| g.handle_request(a, 0, 1000, 3000, 500_000_000) == Admit::Send { verified: false })
            .count();
        assert_eq!(sent, 2);
        // Another source has its own budget.
        let b: SocketAddr = "10.0.0.2:4000".parse().unwrap();
        assert_eq!(g.handle_request(b, 0, 1000, 3000, 500_000_000), Admit::Send { verified: false });
    }

    #[test]
    fn the_source_table_is_bounded_and_forgets_quiet_sources() {
        let mut g = guard(GuardConfig { ratio: 3, budget: 10_000, max_sources: 4 });
        let src = |i: u8| SocketAddr::from(([10, 0, 1, i], 4000));
        for i in 0..4 {
            assert_eq!(g.handle_request(src(i), 0, 100, 100, 0), Admit::Send { verified: false });
        }
        assert!(matches!(g.handle_request(src(9), 0, 100, 100, 0), Admit::Retry(_)), "the table is full");
        assert_eq!(g.sources(), 4);
        assert_eq!(g.handle_request(src(9), 0, 100, 100, 2_000_000_000), Admit::Send { verified: false });
        assert_eq!(g.sources(), 1, "the quiet ones were forgotten");
    }
}
