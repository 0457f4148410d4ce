//! One client thread: its share of the clients (a socket each) on one epoll, their
//! timers on one heap, open-loop arrivals, and its counts for the report.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use netlane::metrics::cpu::thread_cpu;
use netlane::metrics::hist::Hist;
use netlane::time::monotonic_ns;
use netlane::udp::{Receiver, ReceiverConfig, RxBatching, UdpSocket};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use super::{ClientsConfig, HERD, Load};
use crate::proto::client::{Client, ClientStats, Expired, Received};

/// One thread's result.
pub(super) struct Part {
    pub(super) hist: Hist,
    pub(super) measured: ClientStats,
    pub(super) arrivals_dropped: u64,
    pub(super) send_errors: u64,
    pub(super) recv_errors: u64,
    pub(super) in_flight: u64,
    pub(super) cpu_s: f64,
    pub(super) end_ns: u64,
    pub(super) woken: Woken,
    pub(super) refused: Option<u32>,
}

/// Wake-ups of a client thread's epoll wait that found sockets ready, in the measured
/// time, and the sockets each found.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Woken {
    pub(super) wakeups: u64,
    pub(super) sockets: u64,
    pub(super) max_sockets: u64,
    /// Sockets woken in wake-ups of at least [`HERD`].
    pub(super) herd_sockets: u64,
}

impl Woken {
    /// A wait returned `n` ready sockets.
    pub(super) fn record(&mut self, n: usize) {
        let n = n as u64;
        if n == 0 {
            return;
        }
        self.wakeups += 1;
        self.sockets += n;
        self.max_sockets = self.max_sockets.max(n);
        if n >= HERD {
            self.herd_sockets += n;
        }
    }
}

/// What `clients` counted since `base` (their counts when the measured time began).
pub(super) fn measured_since(clients: &[Client], base: &[ClientStats]) -> ClientStats {
    let mut measured = ClientStats::default();
    for (c, b) in clients.iter().zip(base) {
        let s = c.stats();
        measured.requests += s.requests - b.requests;
        measured.responses += s.responses - b.responses;
        measured.retransmits += s.retransmits - b.retransmits;
        measured.lost += s.lost - b.lost;
        measured.late += s.late - b.late;
        measured.duplicates += s.duplicates - b.duplicates;
        measured.corrupt += s.corrupt - b.corrupt;
        measured.mismatched += s.mismatched - b.mismatched;
        measured.partial += s.partial - b.partial;
        measured.retried += s.retried - b.retried;
    }
    measured
}

/// One thread's clients, their timers and what they counted.
pub(super) struct Worker<'a> {
    cfg: &'a ClientsConfig,
    socks: Vec<UdpSocket>,
    clients: Vec<Client>,
    /// Per client: when it may send next (closed loop: after thinking).
    next_send: Vec<Option<u64>>,
    /// Timers (time, client), lazily invalidated: an entry whose time no longer matches
    /// the client's next event is skipped.
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    rx: Receiver,
    buf: Vec<u8>,
    done: Vec<u64>,
    hist: Hist,
    measure_from: u64,
    measure_to: u64,
    at_start: Option<Vec<ClientStats>>,
    arrivals_dropped: u64,
    send_errors: u64,
    recv_errors: u64,
    /// The server refused a request as too large: the most it sends.
    refused: Option<u32>,
    /// Open loop: next arrival, the rotating client index, the random state.
    next_arrival: u64,
    rr: usize,
    rng: u64,
}

impl<'a> Worker<'a> {
    pub(super) fn new(
        cfg: &'a ClientsConfig,
        thread: usize,
        first: usize,
        socks: Vec<UdpSocket>,
        measure_from: u64,
        measure_to: u64,
    ) -> Self {
        let n = socks.len();
        let clients = (0..n).map(|i| Client::new(cfg.client, ((first + i) as u64) << 40)).collect::<Vec<_>>();
        Worker {
            cfg,
            socks,
            clients,
            next_send: vec![None; n],
            timers: BinaryHeap::new(),
            rx: Receiver::new(ReceiverConfig {
                batching: RxBatching::Mmsg(8),
                slot_len: ReceiverConfig::MAX_SLOT,
                want_source: false,
            }),
            buf: vec![0; cfg.client.request_len],
            done: Vec::with_capacity(64),
            hist: Hist::new(),
            measure_from,
            measure_to,
            at_start: None,
            arrivals_dropped: 0,
            send_errors: 0,
            recv_errors: 0,
            refused: None,
            next_arrival: 0,
            rr: 0,
            // Never 0: xorshift stays there.
            rng: (0x9e37_79b9_7f4a_7c15
                ^ (thread as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed69)
                ^ cfg.seed.wrapping_mul(0x94d0_49bb_1331_11eb))
            .max(1),
        }
    }

    /// Runs until the measured time has passed or `stop` is set; adds to `answered` the
    /// responses measured as they come.
    pub(super) fn run(mut self, stop: &AtomicBool, answered: &AtomicU64) -> io::Result<Part> {
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        for (i, s) in self.socks.iter().enumerate() {
            ep.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))?;
        }
        let mut cpu0 = thread_cpu();
        let now = monotonic_ns();
        match self.cfg.load {
            Load::Closed { .. } => {
                for i in 0..self.clients.len() {
                    self.send_new(i, now);
                }
            }
            Load::Open { .. } => self.next_arrival = now,
        }
        let mut events = vec![EpollEvent::empty(); self.socks.len().min(256)];
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
            self.fire_timers(now);
            let wake = self.next_wake().min(self.measure_to).min(now + 100_000_000);
            // Nanosecond deadlines: think times and arrivals below a millisecond are kept.
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
                self.drain(ev.data() as usize);
            }
        }
        let base = self.at_start.take().unwrap_or_else(|| self.clients.iter().map(Client::stats).collect());
        Ok(Part {
            hist: self.hist,
            measured: measured_since(&self.clients, &base),
            arrivals_dropped: self.arrivals_dropped,
            send_errors: self.send_errors,
            recv_errors: self.recv_errors,
            in_flight: self.clients.iter().map(|c| c.in_flight() as u64).sum(),
            cpu_s: thread_cpu().total_s() - cpu0.total_s(),
            end_ns: end_ns.min(self.measure_to),
            woken,
            refused: self.refused,
        })
    }

    fn next_wake(&self) -> u64 {
        let t = self.timers.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
        match self.cfg.load {
            Load::Open { .. } => t.min(self.next_arrival),
            Load::Closed { .. } => t,
        }
    }

    fn fire_timers(&mut self, now: u64) {
        if let Load::Open { rate } = self.cfg.load {
            let per_thread = rate / self.cfg.threads as f64;
            while self.next_arrival <= now {
                self.arrive(now);
                self.next_arrival += self.exp_ns(per_thread);
            }
        }
        while let Some(&Reverse((t, i))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if self.next_send[i] == Some(t) {
                self.next_send[i] = None;
                self.send_new(i, now);
            }
            self.expire(i, now);
        }
    }

    /// Open loop: the next arrival goes to the next client that may send.
    fn arrive(&mut self, now: u64) {
        let n = self.clients.len();
        for k in 0..n {
            let i = (self.rr + k) % n;
            if self.clients[i].can_send() {
                self.rr = i + 1;
                self.send_new(i, now);
                return;
            }
        }
        self.arrivals_dropped += 1;
    }

    /// An exponential inter-arrival time for `rate` per second, ns.
    fn exp_ns(&mut self, rate: f64) -> u64 {
        // xorshift64*: enough randomness for arrival times, no crate needed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let u = (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        let secs = -(1.0 - u).ln() / rate;
        (secs * 1e9).clamp(1.0, 1e12) as u64
    }

    fn send_new(&mut self, i: usize, now: u64) {
        match self.clients[i].poll_transmit(now, &mut self.buf) {
            Ok(Some(n)) => {
                self.transmit(i, n);
                self.arm(i);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "request does not fit its buffer");
                self.send_errors += 1;
            }
        }
    }

    fn expire(&mut self, i: usize, now: u64) {
        loop {
            match self.clients[i].handle_timeout(now, &mut self.buf) {
                Ok(Some(Expired::Resend(n))) => self.transmit(i, n),
                Ok(Some(Expired::Lost)) => {
                    // Closed loop: the client moves on to its next request.
                    if let Load::Closed { .. } = self.cfg.load {
                        self.after_response(i, now);
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    self.send_errors += 1;
                    break;
                }
            }
        }
        self.arm(i);
    }

    /// Puts the client's next retransmission deadline on the timer heap.
    fn arm(&mut self, i: usize) {
        if let Some(d) = self.clients[i].next_deadline() {
            self.timers.push(Reverse((d, i)));
        }
    }

    fn transmit(&mut self, i: usize, n: usize) {
        if let Err(e) = netlane_sys::msg::send(self.socks[i].as_fd(), &self.buf[..n], 0) {
            // The request counts as sent; its timeout will send it again.
            if e.kind() != io::ErrorKind::WouldBlock {
                tracing::debug!(error = %e, "send failed");
            }
            self.send_errors += 1;
        }
    }

    fn after_response(&mut self, i: usize, now: u64) {
        if let Load::Closed { think } = self.cfg.load {
            if think.is_zero() {
                self.send_new(i, now);
            } else {
                let t = now + think.as_nanos() as u64;
                self.next_send[i] = Some(t);
                self.timers.push(Reverse((t, i)));
            }
        }
    }

    fn drain(&mut self, i: usize) {
        // Completions of one receive call, kept across calls (no allocation per response).
        let mut done = std::mem::take(&mut self.done);
        loop {
            done.clear();
            let clients = &mut self.clients;
            let hist = &mut self.hist;
            // Latencies count from the moment the counters' baseline was taken, so the
            // histogram and the response count cover the same completions.
            let measuring = self.at_start.is_some();
            let (mut retry, mut refused) = (false, None);
            let r = self.rx.recv(self.socks[i].as_fd(), |d| {
                let now = monotonic_ns();
                match clients[i].handle_datagram(now, d.data) {
                    Received::Completed { latency_ns, .. } => {
                        if measuring {
                            hist.record(latency_ns);
                        }
                        done.push(now);
                    }
                    Received::Retry => retry = true,
                    Received::Refused { limit } => refused = Some(limit),
                    _ => {}
                }
            });
            for &now in &done {
                self.after_response(i, now);
            }
            if retry {
                self.expire(i, monotonic_ns());
            }
            self.refused = self.refused.or(refused);
            match r {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ECONNREFUSED: the server's port is closed (ICMP). The request
                    // times out and is sent again.
                    tracing::debug!(error = %e, "receive error");
                    self.recv_errors += 1;
                    break;
                }
            }
        }
        self.done = done;
    }
}
