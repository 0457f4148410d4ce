//! This lane's own listener in the reuseport group: connections accepted a batch at a
//! time and placed by their NAPI id, and the rest the listener takes after a failed
//! accept.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use netlane::lanes::Why;
use nix::sys::epoll::{EpollEvent, EpollFlags};

use super::{LISTEN, Worker};
use crate::server::Mail;
use crate::server::accept::admit;
use crate::server::stream::Stream;

/// Connections a lane's listener accepts per turn.
const ACCEPT_BATCH: usize = 64;

impl Worker {
    /// This lane's listener (reuseport steering) has connections: take them. The
    /// selector put them here by their NAPI id; one it could not place (an id it did
    /// not know yet, or id 0) goes to the lane the map picks, and a new id is taught to
    /// the selector so that the next connection on it comes straight to its owner.
    /// Accepts up to a batch; true when the batch ran out before the queue did.
    pub(super) fn accept_own(&mut self) -> bool {
        for _ in 0..ACCEPT_BATCH {
            let Some(l) = &self.listener else { return false };
            match l.accept() {
                Ok((s, _)) => {
                    self.backoff.handle_accepted();
                    self.take_accepted(Stream::Tcp(s));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.shared.limit.handle_accept_error();
                    let rest = self.backoff.handle_error(&e, Instant::now());
                    self.rest_listener(rest);
                    return false;
                }
            }
        }
        true
    }

    /// Takes the listener out of the epoll interest for `rest`; the loop puts it back.
    fn rest_listener(&mut self, rest: Duration) {
        let Some(l) = &self.listener else { return };
        let mut none = EpollEvent::new(EpollFlags::empty(), LISTEN);
        if self.epoll.modify(l.as_fd(), &mut none).is_ok() {
            self.listener_rests_until = Some(Instant::now() + rest);
        }
    }

    /// Puts a resting listener back once its rest is over.
    pub(super) fn wake_listener(&mut self) {
        let (Some(t), Some(l)) = (self.listener_rests_until, &self.listener) else { return };
        if Instant::now() >= t {
            let mut readable = EpollEvent::new(EpollFlags::EPOLLIN, LISTEN);
            let _ = self.epoll.modify(l.as_fd(), &mut readable);
            self.listener_rests_until = None;
        }
    }

    fn take_accepted(&mut self, s: Stream) {
        let Some((s, admitted)) = admit(&self.shared, s) else { return };
        let napi_id = netlane::sockopt::incoming_napi_id(s.as_fd()).unwrap_or(0);
        let lanes = &self.shared.lanes;
        let mut map = lanes.map();
        let p = {
            match map.owner(napi_id) {
                // The selector's choice, or the owner another lane's listener missed.
                Some(lane) => {
                    let _ = map.place_on(lane);
                    netlane::lanes::Placement { lane, why: Why::Owner }
                }
                None if napi_id == 0 || !map.has_lane(self.id) => {
                    // No NAPI id: the kernel's hash already spread these; keep it here
                    // unless this lane is leaving (no longer in the map).
                    let lane = if map.has_lane(self.id) {
                        self.id
                    } else {
                        map.least_loaded(Some(self.id)).unwrap_or(self.id)
                    };
                    let _ = map.place_on(lane);
                    netlane::lanes::Placement { lane, why: Why::NoNapi }
                }
                None => map.place(napi_id),
            }
        };
        lanes.counters[p.lane].placed(Some(p.why));
        if p.lane != self.id {
            lanes.counters[self.id].handed_over.fetch_add(1, Ordering::Relaxed);
        }
        // Posted with the map held (see the acceptor).
        self.shared.mailbox(p.lane).post(Mail::Conn { stream: s, napi_id, admitted });
        drop(map);
        if p.why == Why::NewId {
            lanes.resync();
        }
    }
}
