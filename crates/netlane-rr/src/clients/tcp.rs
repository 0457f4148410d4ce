//! One client thread of the TCP comparator: its share of the clients (a connection each,
//! closed loop) on one epoll. The same sans-IO client as over UDP takes each message the
//! stream carries as it would a datagram; the stack's TCP retransmits, so the client's
//! own timeouts are not used: a request whose connection closed is left in flight (the
//! report's `in_flight_at_end`), its client sending no more, the close counted as a
//! receive error.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use netlane::metrics::cpu::thread_cpu;
use netlane::metrics::hist::Hist;
use netlane::time::monotonic_ns;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use super::worker::{Part, Woken, measured_since};
use super::{ClientsConfig, Load};
use crate::proto::client::{Client, ClientStats, Received};
use crate::proto::stream::Framer;
use crate::proto::wire::MAX_DATAGRAM;

/// One client's connection.
struct Conn {
    stream: TcpStream,
    framer: Framer,
    /// Requests not yet written, and how much of them is.
    out: Vec<u8>,
    written: usize,
    /// Whether the loop waits for room to write too.
    waits: bool,
    /// Closed (by the server, or broken): its client sends no more.
    closed: bool,
}

/// One thread's clients over TCP.
pub(super) struct TcpWorker<'a> {
    cfg: &'a ClientsConfig,
    conns: Vec<Conn>,
    clients: Vec<Client>,
    /// Closed loop with a think time: when each client may send next.
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    buf: Vec<u8>,
    hist: Hist,
    measure_from: u64,
    measure_to: u64,
    at_start: Option<Vec<ClientStats>>,
    send_errors: u64,
    recv_errors: u64,
    refused: Option<u32>,
}

impl<'a> TcpWorker<'a> {
    pub(super) fn new(
        cfg: &'a ClientsConfig,
        first: usize,
        streams: Vec<TcpStream>,
        measure_from: u64,
        measure_to: u64,
    ) -> Self {
        let clients = (0..streams.len()).map(|i| Client::new(cfg.client, ((first + i) as u64) << 40)).collect();
        // A response is at most the largest datagram's worth per segment, and echo
        // messages are requests.
        let max_message = MAX_DATAGRAM;
        let conns = streams
            .into_iter()
            .map(|stream| Conn {
                stream,
                framer: Framer::new(max_message),
                out: Vec::new(),
                written: 0,
                waits: false,
                closed: false,
            })
            .collect();
        TcpWorker {
            cfg,
            conns,
            clients,
            timers: BinaryHeap::new(),
            buf: vec![0; cfg.client.request_len],
            hist: Hist::new(),
            measure_from,
            measure_to,
            at_start: None,
            send_errors: 0,
            recv_errors: 0,
            refused: None,
        }
    }

    /// Runs until the measured time has passed or `stop` is set; adds to `answered` the
    /// responses measured as they come.
    pub(super) fn run(mut self, stop: &AtomicBool, answered: &AtomicU64) -> io::Result<Part> {
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        for (i, c) in self.conns.iter().enumerate() {
            ep.add(c.stream.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))?;
        }
        let mut cpu0 = thread_cpu();
        let now = monotonic_ns();
        for i in 0..self.clients.len() {
            self.send_new(&ep, i, now);
        }
        let mut events = vec![EpollEvent::empty(); self.conns.len().min(256)];
        let mut end_ns = now;
        let mut woken = Woken::default();
        let mut told = 0;
        loop {
            if self.hist.count() != told {
                answered.fetch_add(self.hist.count() - told, Ordering::Relaxed);
                told = self.hist.count();
            }
            let now = monotonic_ns();
            if self.at_start.is_none() && now >= self.measure_from {
                self.at_start = Some(self.clients.iter().map(Client::stats).collect());
                cpu0 = thread_cpu();
            }
            if now >= self.measure_to || stop.load(Ordering::Relaxed) || self.refused.is_some() {
                end_ns = end_ns.max(now);
                break;
            }
            while let Some(&Reverse((t, i))) = self.timers.peek() {
                if t > now {
                    break;
                }
                self.timers.pop();
                self.send_new(&ep, i, now);
            }
            let next = self.timers.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
            let wake = next.min(self.measure_to).min(now + 100_000_000);
            let timeout = Duration::from_nanos(wake.saturating_sub(monotonic_ns()));
            let n = match netlane_sys::epoll::wait(&ep, &mut events, Some(timeout)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => return Err(e.into()),
            };
            if self.at_start.is_some() {
                woken.record(n);
            }
            for ev in &events[..n] {
                let i = ev.data() as usize;
                if ev.events().contains(EpollFlags::EPOLLOUT) {
                    self.flush(&ep, i);
                }
                self.drain(&ep, i);
            }
        }
        let base = self.at_start.take().unwrap_or_else(|| self.clients.iter().map(Client::stats).collect());
        Ok(Part {
            hist: self.hist,
            measured: measured_since(&self.clients, &base),
            arrivals_dropped: 0,
            send_errors: self.send_errors,
            recv_errors: self.recv_errors,
            in_flight: self.clients.iter().map(|c| c.in_flight() as u64).sum(),
            cpu_s: thread_cpu().total_s() - cpu0.total_s(),
            end_ns: end_ns.min(self.measure_to),
            woken,
            refused: self.refused,
        })
    }

    /// The client's next request, written to its connection.
    fn send_new(&mut self, ep: &Epoll, i: usize, now: u64) {
        if self.conns[i].closed {
            return;
        }
        match self.clients[i].poll_transmit(now, &mut self.buf) {
            Ok(Some(n)) => {
                self.conns[i].out.extend_from_slice(&self.buf[..n]);
                self.flush(ep, i);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "request does not fit its buffer");
                self.send_errors += 1;
            }
        }
    }

    /// Writes what the connection owes; waits for room when the socket is full.
    fn flush(&mut self, ep: &Epoll, i: usize) {
        let c = &mut self.conns[i];
        while c.written < c.out.len() {
            match c.stream.write(&c.out[c.written..]) {
                Ok(n) => c.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !c.waits {
                        let mut want = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT, i as u64);
                        c.waits = true;
                        if ep.modify(c.stream.as_fd(), &mut want).is_err() {
                            // Never told of room to write: the client would stall.
                            self.send_errors += 1;
                            close(ep, c);
                        }
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "send failed");
                    self.send_errors += 1;
                    close(ep, c);
                    return;
                }
            }
        }
        c.out.clear();
        c.written = 0;
        if c.waits {
            let mut want = EpollEvent::new(EpollFlags::EPOLLIN, i as u64);
            c.waits = false;
            if ep.modify(c.stream.as_fd(), &mut want).is_err() {
                self.send_errors += 1;
                close(ep, c);
            }
        }
    }

    /// Reads what the connection has and hands each whole message to its client; the
    /// closed loop's next request follows each completed response.
    fn drain(&mut self, ep: &Epoll, i: usize) {
        let measuring = self.at_start.is_some();
        loop {
            let c = &mut self.conns[i];
            if c.closed {
                return;
            }
            let (mut completed, mut refused) = (0u32, None);
            let now = monotonic_ns();
            loop {
                match c.framer.poll_message() {
                    Ok(Some(m)) => match self.clients[i].handle_datagram(now, m) {
                        Received::Completed { latency_ns, .. } => {
                            if measuring {
                                self.hist.record(latency_ns);
                            }
                            completed += 1;
                        }
                        Received::Refused { limit } => refused = Some(limit),
                        _ => {}
                    },
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "the server's stream is not messages");
                        self.recv_errors += 1;
                        close(ep, c);
                        return;
                    }
                }
            }
            self.refused = self.refused.or(refused);
            for _ in 0..completed {
                self.after_response(ep, i, now);
            }
            let c = &mut self.conns[i];
            match c.stream.read(c.framer.read_space()) {
                Ok(0) => {
                    self.recv_errors += 1;
                    close(ep, c);
                    return;
                }
                Ok(n) => c.framer.filled(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(error = %e, "receive failed");
                    self.recv_errors += 1;
                    close(ep, c);
                    return;
                }
            }
        }
    }

    fn after_response(&mut self, ep: &Epoll, i: usize, now: u64) {
        if let Load::Closed { think } = self.cfg.load {
            if think.is_zero() {
                self.send_new(ep, i, now);
            } else {
                self.timers.push(Reverse((now + think.as_nanos() as u64, i)));
            }
        }
    }
}

/// The connection is done: its client sends no more, and it is no longer watched.
fn close(ep: &Epoll, c: &mut Conn) {
    c.closed = true;
    let _ = ep.delete(c.stream.as_fd());
}
