//! How connections end on a lane: closed, kicked when idle, the lingering close that
//! lets a final error line reach the peer, and every one at stop.

use std::io::ErrorKind;
use std::sync::atomic::Ordering;

use super::{Entry, Worker, flush};
use crate::proto::Counters;

/// How long a closing connection waits for its peer to close.
const LINGER_MS: u64 = 1000;

impl Worker {
    pub(super) fn close(&mut self, idx: usize) {
        if let Some(slot) = self.conns.get_mut(idx)
            && slot.take().is_some()
        {
            self.free.push(idx);
            self.shared.lanes.map().closed(self.id);
        }
    }

    pub(super) fn kick_idle(&mut self, now: u64) {
        let limit = self.idle_timeout.map(|d| d.as_millis() as u64);
        let mut idle = Vec::new();
        let mut done_lingering = Vec::new();
        for (i, e) in self.conns.iter().enumerate() {
            let Some(e) = e else { continue };
            if e.lingering_since.is_some_and(|t| now.saturating_sub(t) > LINGER_MS) {
                done_lingering.push(i);
            } else if limit.is_some_and(|l| now.saturating_sub(e.last_active_ms) > l) {
                idle.push(i);
            }
        }
        for i in idle {
            self.shared.conns.idle_kicks.fetch_add(1, Ordering::Relaxed);
            self.close(i);
        }
        for i in done_lingering {
            self.close(i);
        }
    }

    pub(super) fn shutdown(&mut self) {
        for i in 0..self.conns.len() {
            if let Some(e) = &mut self.conns[i] {
                let _ = flush(e, &mut self.counters);
            }
            self.close(i);
        }
        // Connections still in the mailbox close unserved (and give their places back).
        drop(self.shared.mailbox(self.id).take());
        self.shared.workers[self.id].publish(&self.counters);
    }
}

/// A closing connection's step: write the rest, shut the sending side, drop input.
/// Returns true when it can be closed now.
pub(super) fn linger(e: &mut Entry, c: &mut Counters) -> bool {
    if !flush(e, c) {
        return true;
    }
    if e.conn.unsent() > 0 {
        return false;
    }
    if !e.shut {
        e.shut = true;
        if e.stream.shutdown_write().is_err() {
            return true;
        }
    }
    let mut sink = [0u8; 16384];
    // A bounded step, like a turn: a peer that keeps sending brings another edge (and a
    // lingering connection is closed at its deadline whatever it sends).
    for _ in 0..LINGER_READS {
        match e.stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(err) if err.kind() == ErrorKind::WouldBlock => return false,
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    false
}

/// Reads of discarded input one lingering step makes at most.
const LINGER_READS: u32 = 16;
