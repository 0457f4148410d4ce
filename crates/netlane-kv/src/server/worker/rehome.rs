//! Connections leaving this lane whole: those whose NAPI id another lane now owns, or
//! every one when the lane retires, posted with their buffered input and output.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use netlane::lanes::LaneId;

use super::{Moving, Worker};
use crate::server::Mail;

/// UDP batches a leaving lane serves before its socket closes.
const UDP_RETIRE_BATCHES: usize = 16;

impl Worker {
    /// Gives away the connections another lane should have: those whose NAPI id another
    /// lane now owns, or (`all`: this lane is leaving) every one, those without an owner
    /// to the least-loaded lane. A leaving lane first takes what its listener and UDP
    /// socket still hold.
    pub(super) fn rehome(&mut self, all: bool) {
        if all {
            if self.listener.is_some() {
                // The selector no longer sends new flows here; what already arrived is
                // served by the lanes that own it now. (Handshakes still in flight when
                // the listener closes move to another listener of the group only with
                // net.ipv4.tcp_migrate_req, which the server sets for reuseport lanes.)
                while self.accept_own() {}
                if let Some(l) = self.listener.take() {
                    let _ = self.epoll.delete(l.as_fd());
                }
            }
            if self.udp.is_some() {
                // Serve what waits, bounded: the kernel's hash may still send datagrams
                // here until the socket closes, and a flood must not keep it open.
                for _ in 0..UDP_RETIRE_BATCHES {
                    self.udp_pending = true;
                    self.serve_udp();
                    if !self.udp_pending {
                        break;
                    }
                }
                self.udp = None;
            }
        }
        for idx in 0..self.conns.len() {
            let Some(e) = &self.conns[idx] else { continue };
            let target = {
                let map = self.shared.lanes.map();
                match map.owner(e.napi_id) {
                    Some(o) if o != self.id => Some(o),
                    _ if all => map.least_loaded(Some(self.id)),
                    _ => None,
                }
            };
            if let Some(to) = target.filter(|&t| t != self.id) {
                self.ship(idx, to);
            }
        }
    }

    /// Moves connection `idx`, whole, to lane `to`.
    fn ship(&mut self, idx: usize, to: LaneId) {
        let Some(e) = self.conns.get_mut(idx).and_then(Option::take) else { return };
        let _ = self.epoll.delete(e.stream.as_fd());
        self.free.push(idx);
        let shared = self.shared.clone();
        let mut map = shared.lanes.map();
        if map.moved(self.id, to).is_err() {
            // The lane went away meanwhile: keep the connection here.
            drop(map);
            self.register(e);
            return;
        }
        shared.lanes.counters[self.id].moved_out.fetch_add(1, Ordering::Relaxed);
        // Posted with the map held (see the acceptor).
        shared.mailbox(to).post(Mail::Moved(Box::new(Moving { entry: e })));
        drop(map);
    }
}
