//! The connection limit: at most `max` connections open at once, each holding its place
//! through an [`Admitted`] token that gives it back when dropped. A connection's token
//! travels with it (into a reactor, a lane's mailbox, from lane to lane), so no path that
//! closes or drops a connection can forget to count it out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

netlane_counters::counters! {
    /// What a server's connection limit saw.
    #[derive(serde::Serialize, schemars::JsonSchema)]
    pub struct ConnCounts, shared SharedConnCounts {
        /// Connections admitted.
        admitted,
        /// Connections refused because the limit was reached.
        refused,
        /// Failed accept() calls, and accepted connections that could not be set up.
        accept_errors,
    }
}

#[derive(Debug)]
struct Inner {
    max: u64,
    open: AtomicU64,
    counts: SharedConnCounts,
}

/// A server's connection limit, shared by every thread that accepts.
#[derive(Debug, Clone)]
pub struct ConnLimit {
    inner: Arc<Inner>,
}

/// One admitted connection's place under the limit; dropping it frees the place.
#[derive(Debug)]
pub struct Admitted {
    inner: Arc<Inner>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.inner.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnLimit {
    /// At most `max` connections open at once.
    pub fn new(max: u64) -> ConnLimit {
        ConnLimit { inner: Arc::new(Inner { max, open: AtomicU64::new(0), counts: SharedConnCounts::default() }) }
    }

    /// Admits one more connection if fewer than the limit are open (exactly, however
    /// many threads accept at once); counts it as admitted or refused.
    pub fn admit(&self) -> Option<Admitted> {
        let i = &self.inner;
        match i.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < i.max).then_some(n + 1)) {
            Ok(_) => {
                i.counts.admitted.fetch_add(1, Ordering::Relaxed);
                Some(Admitted { inner: Arc::clone(i) })
            }
            Err(_) => {
                i.counts.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Counts a failed `accept`, or a connection that could not be set up.
    pub fn handle_accept_error(&self) {
        self.inner.counts.accept_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.inner.open.load(Ordering::Acquire)
    }

    /// The limit.
    pub fn max(&self) -> u64 {
        self.inner.max
    }

    /// What the limit has counted so far.
    pub fn counts(&self) -> ConnCounts {
        self.inner.counts.load()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_given_back_when_its_token_drops() {
        let limit = ConnLimit::new(2);
        let a = limit.admit().unwrap();
        let b = limit.admit().unwrap();
        assert!(limit.admit().is_none());
        assert_eq!(limit.open(), 2);
        drop(a);
        let c = limit.admit().unwrap();
        drop((b, c));
        limit.handle_accept_error();
        assert_eq!(limit.open(), 0);
        assert_eq!(limit.counts(), ConnCounts { admitted: 3, refused: 1, accept_errors: 1 });
    }

    #[test]
    fn threads_admitting_at_once_never_pass_the_limit() {
        let limit = ConnLimit::new(5);
        let held: Vec<Vec<Admitted>> = std::thread::scope(|s| {
            let hs: Vec<_> =
                (0..4).map(|_| s.spawn(|| (0..100).filter_map(|_| limit.admit()).collect::<Vec<_>>())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(held.iter().map(Vec::len).sum::<usize>(), 5);
        assert_eq!(limit.counts().refused, 395);
    }
}
