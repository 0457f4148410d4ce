//! The sans-IO memcached protocol: text and meta commands parsed ([`parse`]), carried
//! out against the [`Store`] ([`exec`], [`meta`]), and one
//! connection's byte stream turned into replies ([`conn`]): pipelined commands, partial
//! reads, bounded buffers. [`udp`] is memcached's UDP frame header.
//!
//! No sockets, clocks or threads: the driver passes the time in a [`Clock`] and the
//! server's own state through [`Host`].
//!
//! It answers as memcached 1.6.18 does; where it differs, on purpose, is listed with the
//! reason in `docs/memcached.md` (one test per row, against this core and against
//! memcached itself: `tests/server.rs`).

pub mod binary;
pub mod budget;
pub mod conformance;
pub mod conn;
pub mod exec;
pub mod fuzzing;
pub mod meta;
pub mod out;
pub mod parse;
pub mod reply;
pub mod stats;
pub mod udp;

use crate::store::{NEVER, Store};

pub use budget::ConnMemory;
pub use conn::{Conn, Limits, Turn};
pub use exec::{Ctx, Protocol, Settings};
pub use stats::{Counters, SharedCounters};

/// Relative expiry times above this are absolute Unix times (30 days, as memcached).
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// The time as the protocol sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// Milliseconds on the server's monotonic clock (the store's time).
    pub now_ms: u64,
    /// The Unix time, in milliseconds, when `now_ms` was 0 (absolute expiry times).
    pub epoch_ms: u64,
}

impl Clock {
    /// The store deadline for a protocol expiry time: 0 never; negative already
    /// expired; up to 30 days from now; beyond that a Unix time (in the past: expired).
    pub fn deadline(&self, exptime: i64) -> u64 {
        match exptime {
            0 => NEVER,
            e if e < 0 => 0,
            e if e <= REALTIME_MAXDELTA => self.now_ms.saturating_add(e as u64 * 1000),
            e => (e as u64).saturating_mul(1000).saturating_sub(self.epoch_ms),
        }
    }

    /// Seconds left before `exp`, -1 for never (meta `t`), rounded up.
    pub fn ttl_secs(&self, exp: u64) -> i64 {
        if exp == NEVER {
            -1
        } else {
            let left = exp.saturating_sub(self.now_ms);
            left.div_ceil(1000).min(i64::MAX as u64) as i64
        }
    }

    /// The Unix time now, seconds.
    pub fn unix_secs(&self) -> u64 {
        (self.epoch_ms + self.now_ms) / 1000
    }

    /// The clock `secs` seconds later (earlier when negative, not before 0).
    pub fn advanced(self, secs: i64) -> Clock {
        let ms = secs.saturating_mul(1000);
        let now_ms =
            if ms >= 0 { self.now_ms.saturating_add(ms as u64) } else { self.now_ms.saturating_sub(ms.unsigned_abs()) };
        Clock { now_ms, ..self }
    }
}

/// The server around the protocol.
pub trait Host: std::fmt::Debug {
    /// The `VERSION` reply's text.
    fn version(&self) -> &str;
    /// Writes a `stats` reply (every kind), `END` included. `own` are the calling
    /// worker's live counters (the other workers' come from their published copies).
    fn stats(&self, kind: parse::StatsKind, store: &Store, own: &Counters, clock: Clock, out: &mut Vec<u8>);
    /// `verbosity`.
    fn verbosity(&self, level: u32);
    /// `shutdown` (the connection closes after it): stop the server, letting
    /// connections finish when `graceful`.
    fn shutdown(&self, graceful: bool);
    /// memcached-debug's `debugtime`: move the server's clock by `secs` seconds.
    fn advance_clock(&self, secs: i64);
    /// Whether the machine has `bytes` more memory to give the cache (`cache_memlimit`
    /// raising the limit).
    fn may_grow(&self, bytes: u64) -> bool;
}

#[cfg(test)]
mod tests;
