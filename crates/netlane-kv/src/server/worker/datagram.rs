//! This lane's UDP socket: each datagram one request, run whole and answered in
//! memcached's frames.

use std::io::ErrorKind;
use std::sync::atomic::Ordering;

use super::Worker;
use crate::proto::{Ctx, Turn, udp};
use crate::server::host::WorkerHost;

/// UDP datagrams handled per turn before the connections get theirs.
const UDP_BATCH: usize = 64;

impl Worker {
    pub(super) fn serve_udp(&mut self) {
        self.udp_pending = false;
        let Some(sock) = &self.udp else { return };
        let host = WorkerHost { shared: &self.shared, worker: self.id };
        for _ in 0..UDP_BATCH {
            let (n, peer) = match sock.recv_from(&mut self.udp_in) {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "UDP receive");
                    return;
                }
            };
            self.counters.bytes_read += n as u64;
            let (frame, body) = match udp::parse_request(&self.udp_in[..n]) {
                Ok(r) => r,
                Err(_) => {
                    self.counters.udp_dropped += 1;
                    continue;
                }
            };
            self.udp_conn.reset();
            self.udp_conn.handle_input(body);
            let mut ctx = Ctx {
                store: &self.shared.store,
                clock: self.shared.clock(),
                host: &host,
                counters: &mut self.counters,
                settings: &self.shared.settings.proto,
            };
            // Every command of the datagram runs (yielding is for sharing a worker
            // between connections). A reply cut short at the limit is not sent part-way
            // (a client would take it for the whole answer): memcached's error for a get
            // it cannot answer goes instead.
            let turn = loop {
                match self.udp_conn.process(&mut ctx) {
                    Turn::Yield => continue,
                    t => break t,
                }
            };
            if turn == Turn::Blocked {
                self.udp_conn.replace_output(b"SERVER_ERROR out of memory writing get response\r\n");
                self.counters.udp_replies_cut += 1;
            }
            self.shared.conns.udp_requests.fetch_add(1, Ordering::Relaxed);
            let reply = self.udp_conn.poll_output_vec();
            for (h, chunk) in udp::datagrams(frame.request_id, &reply) {
                self.udp_out.clear();
                self.udp_out.extend_from_slice(&h);
                self.udp_out.extend_from_slice(chunk);
                match sock.send_to(&self.udp_out, peer) {
                    Ok(m) => self.counters.bytes_written += m as u64,
                    // A full send buffer loses the rest of this reply (UDP's contract);
                    // the client treats the missing datagrams as a miss.
                    Err(_) => break,
                }
            }
        }
        self.udp_pending = true;
    }
}
