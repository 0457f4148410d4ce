//! MSG_ZEROCOPY completion tracking.
//!
//! With `SO_ZEROCOPY` set, a send with `MSG_ZEROCOPY` pins the caller's pages instead of
//! copying them, so the caller must not touch the buffer until the kernel says it is
//! done. Every successful zerocopy send call takes the next value of a per-socket
//! 32-bit counter; completions arrive on the error queue as inclusive, wrapping ranges
//! of those values, possibly coalesced and (for TCP) out of order
//! (Documentation/networking/msg_zerocopy.rst). A range flagged
//! `SO_EE_CODE_ZEROCOPY_COPIED` means the kernel copied after all (always the case on
//! loopback and veth, where the receive path needs private pages).
//!
//! [`Tracker`] is the sans-IO part: it hands out counter values in send order, holds a
//! caller token (e.g. a buffer index) per send, marks completions, and releases tokens
//! strictly in send order once done, so a buffer pool can recycle them. It counts
//! completions, notifications, copied sends, and completions it did not expect (which
//! would mean a bug or a counter mismatch: never silently ignored).
//! [`drain_errqueue`] is the I/O part: it reads the error queue and feeds the tracker.

use std::collections::VecDeque;
use std::io;
use std::os::fd::BorrowedFd;

use netlane_sys::cmsg::{Cmsg, CmsgBuf, CmsgIter};
use netlane_sys::errqueue::ZerocopyRange;
use serde::Serialize;

/// What the MSG_ZEROCOPY completions said: sends registered and completed, and how many
/// the kernel copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ZerocopyStats {
    /// Zerocopy send calls registered.
    pub sends: u64,
    /// Error-queue notifications processed (each may cover many sends).
    pub notifications: u64,
    /// Sends completed.
    pub completed: u64,
    /// Completed sends the kernel reported as copied.
    pub copied: u64,
    /// Completion values that matched no outstanding send (duplicates or unknown).
    pub unexpected: u64,
}

impl ZerocopyStats {
    /// Fraction of completed sends that were copied (0 when none completed).
    pub fn copied_fraction(&self) -> f64 {
        if self.completed == 0 { 0.0 } else { self.copied as f64 / self.completed as f64 }
    }
}

#[derive(Debug)]
enum Slot<T> {
    Pending(T),
    Done(T),
    Released,
}

/// Tracks outstanding zerocopy sends and their completions.
#[derive(Debug)]
pub struct Tracker<T> {
    /// Counter value of `slots[0]`.
    base: u32,
    slots: VecDeque<Slot<T>>,
    stats: ZerocopyStats,
}

impl<T> Default for Tracker<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Tracker<T> {
    /// A tracker for a fresh socket (whose counter starts at 0).
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A tracker whose next send will take counter value `first` (for tests of the wrap,
    /// or a socket that already made zerocopy sends).
    pub fn starting_at(first: u32) -> Self {
        Self { base: first, slots: VecDeque::new(), stats: ZerocopyStats::default() }
    }

    /// Registers a successful zerocopy send holding `token`; returns its counter value.
    pub fn on_send(&mut self, token: T) -> u32 {
        let id = self.base.wrapping_add(self.slots.len() as u32);
        self.slots.push_back(Slot::Pending(token));
        self.stats.sends += 1;
        id
    }

    /// Applies one completion notification.
    pub fn on_completion(&mut self, range: ZerocopyRange) {
        self.stats.notifications += 1;
        let window = self.slots.len() as i64;
        let count = range.count();
        // Signed offset of the range's start from the oldest tracked send: a range may
        // begin before it (those sends were already released) and still cover later
        // ones. Counter distances are taken modulo 2^32 as signed 32-bit values.
        let start = i64::from(range.lo.wrapping_sub(self.base) as i32);
        let end = start + count as i64;
        let mut matched = 0u64;
        let (lo, hi) = (start.max(0), end.min(window));
        if lo < hi {
            for off in lo..hi {
                let slot = &mut self.slots[off as usize];
                if let Slot::Pending(_) = slot {
                    let Slot::Pending(token) = std::mem::replace(slot, Slot::Released) else {
                        unreachable!("checked to be pending above")
                    };
                    *slot = Slot::Done(token);
                    matched += 1;
                }
            }
        }
        self.stats.completed += matched;
        if range.copied {
            self.stats.copied += matched;
        }
        self.stats.unexpected += count - matched;
    }

    /// Releases the oldest send's token if it has completed. Tokens come back strictly
    /// in send order.
    pub fn pop_completed(&mut self) -> Option<T> {
        loop {
            match self.slots.front()? {
                Slot::Pending(_) => return None,
                Slot::Released => {
                    self.slots.pop_front();
                    self.base = self.base.wrapping_add(1);
                }
                Slot::Done(_) => {
                    let Some(Slot::Done(token)) = self.slots.pop_front() else {
                        unreachable!("front was checked to be done")
                    };
                    self.base = self.base.wrapping_add(1);
                    return Some(token);
                }
            }
        }
    }

    /// Sends registered but not yet completed.
    pub fn outstanding(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s, Slot::Pending(_))).count()
    }

    /// Whether every registered send has completed.
    pub fn all_completed(&self) -> bool {
        self.stats.completed == self.stats.sends
    }

    /// The counters.
    pub fn stats(&self) -> ZerocopyStats {
        self.stats
    }
}

/// Error-queue records that are not zerocopy completions, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtherRecords {
    /// Sends a qdisc dropped because their SO_TXTIME release time had passed.
    pub txtime_missed: u64,
    /// Sends a qdisc refused for their release time (in the past, before one it already
    /// sent, or on another clock).
    pub txtime_refused: u64,
    /// Anything else (ICMP errors).
    pub other: u64,
}

/// Reads every pending record from `fd`'s error queue without blocking and applies
/// the zerocopy completions to `tracker`. Returns the number of notifications read.
/// Other records (txtime errors, ICMP errors) are counted in `other`.
pub fn drain_errqueue<T>(fd: BorrowedFd<'_>, tracker: &mut Tracker<T>, other: &mut OtherRecords) -> io::Result<usize> {
    let mut control = CmsgBuf::<128>::new();
    let mut n = 0;
    while let Some(r) = netlane_sys::msg::recv_errqueue(fd, control.as_mut_capacity())? {
        control.set_len(r.control_len);
        for raw in CmsgIter::new(control.as_bytes()).flatten() {
            match Cmsg::decode(raw) {
                Cmsg::RecvErr(ee) => match ee.zerocopy() {
                    Some(range) => {
                        tracker.on_completion(range);
                        n += 1;
                    }
                    None => match ee.txtime() {
                        Some(t) if t.missed => other.txtime_missed += 1,
                        Some(_) => other.txtime_refused += 1,
                        None => other.other += 1,
                    },
                },
                _ => other.other += 1,
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(lo: u32, hi: u32, copied: bool) -> ZerocopyRange {
        ZerocopyRange { lo, hi, copied }
    }

    #[test]
    fn completes_in_order_with_coalesced_ranges() {
        let mut t = Tracker::new();
        for buf in 0..5 {
            assert_eq!(t.on_send(buf), buf as u32);
        }
        t.on_completion(range(0, 2, true));
        assert_eq!(t.pop_completed(), Some(0));
        assert_eq!(t.pop_completed(), Some(1));
        assert_eq!(t.pop_completed(), Some(2));
        assert_eq!(t.pop_completed(), None);
        assert_eq!(t.outstanding(), 2);
        t.on_completion(range(3, 4, false));
        assert_eq!(t.pop_completed(), Some(3));
        assert_eq!(t.pop_completed(), Some(4));
        let s = t.stats();
        assert_eq!((s.sends, s.completed, s.copied, s.notifications, s.unexpected), (5, 5, 3, 2, 0));
        assert!(t.all_completed());
        assert!((s.copied_fraction() - 0.6).abs() < 1e-9);
    }

    #[test]
    fn out_of_order_completion_releases_in_send_order() {
        let mut t = Tracker::new();
        for buf in 0..4 {
            t.on_send(buf);
        }
        t.on_completion(range(2, 3, false));
        assert_eq!(t.pop_completed(), None, "send 0 is still in flight");
        t.on_completion(range(0, 1, false));
        assert_eq!((0..4).map(|_| t.pop_completed().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn counter_wraps() {
        let mut t = Tracker::starting_at(u32::MAX - 1);
        let ids: Vec<u32> = (0..4).map(|b| t.on_send(b)).collect();
        assert_eq!(ids, vec![u32::MAX - 1, u32::MAX, 0, 1]);
        t.on_completion(range(u32::MAX - 1, 1, true));
        assert_eq!(t.stats().completed, 4);
        assert_eq!(t.stats().unexpected, 0);
        assert_eq!((0..4).map(|_| t.pop_completed().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn duplicates_and_unknown_ids_are_counted_not_applied() {
        let mut t = Tracker::new();
        t.on_send('a');
        t.on_send('b');
        t.on_completion(range(0, 0, false));
        t.on_completion(range(0, 0, false)); // duplicate
        t.on_completion(range(5, 6, false)); // never sent
        let s = t.stats();
        assert_eq!(s.completed, 1);
        assert_eq!(s.unexpected, 3);
        assert_eq!(t.outstanding(), 1);
        // Released ids no longer match either.
        assert_eq!(t.pop_completed(), Some('a'));
        t.on_completion(range(0, 1, false));
        assert_eq!(t.stats().completed, 2);
        assert_eq!(t.stats().unexpected, 4);
    }

    #[test]
    fn huge_bogus_range_is_bounded() {
        let mut t = Tracker::new();
        t.on_send(());
        t.on_completion(range(0, u32::MAX, false));
        assert_eq!(t.stats().completed, 1);
        assert_eq!(t.stats().unexpected, (1u64 << 32) - 1);
    }
}
