//! The acceptor: takes connections, refuses those over the limit, hands the rest to a
//! worker, and runs the store's active expiry between accepts.

use std::io::{ErrorKind, Write as _};
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::host::Shared;
use super::{Mailbox, Placement};

/// How often the active expiry runs, and how many slots it visits per shard each time:
/// 64 shards x 32 slots every 100 ms is about 20 K slot visits a second. (At 2048 per
/// shard it walked the whole 100 K-item store ten times a second: about 1% of the
/// server CPU in perf, but as a burst of about a millisecond every 100 ms on the
/// worker's CPU, in which 1% of requests waited: the p99 at low load.) Expired items
/// that are read go at once anyway; this only returns the memory of those never read.
const REAP_EVERY: Duration = Duration::from_millis(100);
const REAP_BUDGET: usize = 32;

#[derive(Debug)]
pub(crate) struct Acceptor {
    listener: TcpListener,
    shared: Arc<Shared>,
    mailboxes: Vec<Arc<Mailbox>>,
    stop: Arc<AtomicBool>,
    placement: Placement,
    next: usize,
}

impl Acceptor {
    pub fn new(
        listener: TcpListener,
        shared: Arc<Shared>,
        mailboxes: Vec<Arc<Mailbox>>,
        stop: Arc<AtomicBool>,
        placement: Placement,
    ) -> std::io::Result<Acceptor> {
        listener.set_nonblocking(true)?;
        Ok(Acceptor { listener, shared, mailboxes, stop, placement, next: 0 })
    }

    fn pick(&mut self) -> usize {
        match self.placement {
            Placement::RoundRobin => {
                let w = self.next % self.mailboxes.len();
                self.next = self.next.wrapping_add(1);
                w
            }
        }
    }

    pub fn run(mut self) {
        let mut last_reap = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(100u8));
            self.accept_all();
            if last_reap.elapsed() >= REAP_EVERY {
                last_reap = Instant::now();
                self.shared.store.reap(self.shared.clock().now_ms, REAP_BUDGET);
            }
        }
    }

    fn accept_all(&mut self) {
        // Bounded per wake-up so the stop flag and the reaper are never starved.
        for _ in 0..1024 {
            match self.listener.accept() {
                Ok((mut s, _)) => {
                    let conns = &self.shared.conns;
                    if conns.curr.load(Ordering::Relaxed) >= self.shared.settings.max_conns as u64 {
                        conns.rejected.fetch_add(1, Ordering::Relaxed);
                        let _ = s.set_nonblocking(true);
                        let _ = s.write(b"ERROR Too many open connections\r\n");
                        continue;
                    }
                    if s.set_nonblocking(true).is_err() || s.set_nodelay(true).is_err() {
                        conns.accept_errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    conns.curr.fetch_add(1, Ordering::Relaxed);
                    conns.total.fetch_add(1, Ordering::Relaxed);
                    let w = self.pick();
                    let mb = &self.mailboxes[w];
                    match mb.inbox.lock() {
                        Ok(mut q) => q.push(s),
                        Err(p) => p.into_inner().push(s),
                    }
                    let _ = mb.wake.write(1);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE/ENFILE/ENOBUFS: the pending connection stays queued; back off
                    // instead of spinning on it.
                    self.shared.conns.accept_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }
}
