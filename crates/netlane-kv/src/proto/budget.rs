//! The memory all of a server's connections may hold beyond their base buffers
//! ([`ConnMemory`]), which each [`super::Conn`] charges as its buffers grow and gives
//! back as they shrink or it closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Memory that a server's connections may hold beyond their base buffers: the values
/// being received and the replies waiting to be sent (memcached's `read_buf_mem_limit`).
/// A value that cannot get memory is refused (`SERVER_ERROR out of memory storing
/// object`, as memcached does); a connection whose replies cannot get memory stops
/// running commands until the client has read.
#[derive(Debug)]
pub struct ConnMemory {
    used: AtomicU64,
    limit: u64,
    /// Values refused for lack of it.
    refused_values: AtomicU64,
    /// Times a connection stopped for lack of it.
    paused_replies: AtomicU64,
}

impl ConnMemory {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<ConnMemory> {
        Arc::new(ConnMemory {
            used: AtomicU64::new(0),
            limit,
            refused_values: AtomicU64::new(0),
            paused_replies: AtomicU64::new(0),
        })
    }

    /// Takes `n` bytes; false, and nothing taken, when they would pass the limit.
    pub(crate) fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(n).filter(|&t| t <= self.limit))
            .is_ok()
    }

    /// Gives back `n` bytes taken before.
    pub(crate) fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    pub(crate) fn refused_value(&self) {
        self.refused_values.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn paused_reply(&self) {
        self.paused_replies.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Values refused for lack of memory.
    pub fn refused_values(&self) -> u64 {
        self.refused_values.load(Ordering::Relaxed)
    }

    /// Times a connection stopped for lack of memory for its replies.
    pub fn paused_replies(&self) -> u64 {
        self.paused_replies.load(Ordering::Relaxed)
    }
}
