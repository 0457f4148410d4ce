//! The acceptor: takes connections, refuses those over the limit, hands the rest to a
//! lane ([`Steer::RoundRobin`]: the next; [`Steer::Acceptor`]: the owner of the NAPI id
//! the connection's packets arrive through), and runs the store's active expiry between
//! accepts. With [`Steer::Reuseport`] the lanes accept for themselves and this thread
//! only runs the expiry.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use netlane::serve::{AcceptBackoff, Admitted, Stop};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::Mail;
use super::host::Shared;
use super::lanes::Steer;
use super::stream::{Listener, Stream};

/// How often the active expiry runs, and how many slots it visits per shard each time:
/// a small budget per pass, so that no pass is a burst the requests behind it wait for
/// (docs/results.md has the p99 a whole-store pass cost). Expired items that are read go
/// at once anyway; this only returns the memory of those never read.
const REAP_EVERY: Duration = Duration::from_millis(100);
const REAP_BUDGET: usize = 32;

#[derive(Debug)]
pub(crate) struct Acceptor {
    listener: Option<Listener>,
    shared: Arc<Shared>,
    stop: Stop,
    next: usize,
    backoff: AcceptBackoff,
}

impl Acceptor {
    pub fn new(listener: Option<Listener>, shared: Arc<Shared>, stop: Stop) -> std::io::Result<Acceptor> {
        if let Some(Listener::Tcp(l)) = &listener {
            l.set_nonblocking(true)?;
        }
        Ok(Acceptor { listener, shared, stop, next: 0, backoff: AcceptBackoff::new() })
    }

    pub fn run(mut self) {
        let mut last_reap = Instant::now();
        while !self.stop.is_stopped() {
            match &self.listener {
                Some(l) => {
                    // The stop signal beside the listener: a stop wakes this wait at once.
                    let mut fds =
                        [PollFd::new(l.as_fd(), PollFlags::POLLIN), PollFd::new(self.stop.as_fd(), PollFlags::POLLIN)];
                    let _ = poll(&mut fds, PollTimeout::from(100u8));
                    self.accept_all();
                    let wait = self.backoff.poll_wait();
                    if !wait.is_zero() {
                        self.stop.wait(wait);
                    }
                }
                None => {
                    self.stop.wait(REAP_EVERY);
                }
            }
            if last_reap.elapsed() >= REAP_EVERY {
                last_reap = Instant::now();
                self.shared.store.reap(self.shared.now_ms(), REAP_BUDGET);
            }
        }
    }

    fn accept_all(&mut self) {
        let Some(listener) = &self.listener else { return };
        // Bounded per wake-up so the stop signal and the reaper are never starved.
        for _ in 0..1024 {
            match listener.accept() {
                Ok(s) => {
                    self.backoff.handle_accepted();
                    let Some((s, admitted)) = admit(&self.shared, s) else { continue };
                    let napi_id = netlane::sockopt::incoming_napi_id(s.as_fd()).unwrap_or(0);
                    let lanes = &self.shared.lanes;
                    let mut map = lanes.map();
                    let (lane, why) = match lanes.steer {
                        Steer::Acceptor => {
                            let p = map.place(napi_id);
                            (p.lane, Some(p.why))
                        }
                        Steer::RoundRobin | Steer::Reuseport => {
                            let lane = map.nth_lane(self.next);
                            self.next = self.next.wrapping_add(1);
                            let _ = map.place_on(lane);
                            (lane, None)
                        }
                    };
                    lanes.counters[lane].placed(why);
                    // Posted with the map held: a lane being removed is either still in
                    // the map (and drains its mailbox) or was not chosen.
                    self.shared.mailbox(lane).post(Mail::Conn { stream: s, napi_id, admitted });
                    drop(map);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // The pending connection stays queued: the caller waits before the
                    // next try instead of spinning on it.
                    self.shared.limit.handle_accept_error();
                    self.backoff.handle_error(&e, Instant::now());
                    return;
                }
            }
        }
    }
}

/// The connection limit and the socket options every accepted connection gets: `None`
/// when it was refused (over the limit: memcached's error line, then closed) or could
/// not be set up. Otherwise the connection with its place under the limit, which it
/// keeps until it is dropped.
pub(crate) fn admit(shared: &Shared, s: Stream) -> Option<(Stream, Admitted)> {
    if s.prepare().is_err() {
        shared.limit.handle_accept_error();
        return None;
    }
    let Some(admitted) = shared.limit.admit() else {
        let _ = s.write(b"ERROR Too many open connections\r\n");
        return None;
    };
    Some((s, admitted))
}
