//! The client population: N clients, each with its own UDP socket (so the server sees N
//! 4-tuples), many per thread, driven by epoll.
//!
//! Closed loop (the talk's workload): a client sends a request, waits for its response,
//! thinks, and sends the next. Open loop: requests arrive at a Poisson rate whatever the
//! responses do, spread over the clients round-robin (each may then have several in
//! flight); an arrival that finds every client at its limit is counted, not lost
//! silently. Every client retransmits on timeout and gives up after its retries; late,
//! duplicate, corrupted and misassembled responses are counted, never accepted.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use netlane::cpus::CpuList;
use netlane::metrics::Summary;
use netlane::metrics::cpu::thread_cpu;
use netlane::metrics::hist::Hist;
use netlane::time::monotonic_ns;
use netlane::udp::{Receiver, ReceiverConfig, RxBatching, UdpSocket};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use serde::Serialize;

use crate::proto::client::{Client, ClientConfig, ClientConfigError, ClientStats, Expired, MAX_OUTSTANDING, Received};
use crate::proto::wire::MAX_DATAGRAM;

/// The most clients one run may have.
pub const MAX_CLIENTS: usize = 65_536;

/// The highest open-loop rate (requests per second): far above what one machine sends,
/// low enough that an overdue schedule cannot spin through millions of arrivals.
pub const MAX_RATE: f64 = 10_000_000.0;

/// How requests are issued.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Each client: request, response, think for this long, again.
    Closed {
        /// Think time between a response and the next request.
        think: Duration,
    },
    /// Poisson arrivals at this many requests per second in all.
    Open {
        /// Requests per second.
        rate: f64,
    },
}

/// A client population.
#[derive(Debug, Clone)]
pub struct ClientsConfig {
    /// Where to send.
    pub server: SocketAddr,
    /// Clients (sockets).
    pub clients: usize,
    /// Threads the clients are spread over.
    pub threads: usize,
    /// CPUs the threads are pinned to (thread i on the i-th, wrapping); None: unbound.
    pub cpus: Option<CpuList>,
    /// Request size, response size, echo, timeout and retries.
    pub client: ClientConfig,
    /// Closed or open loop.
    pub load: Load,
    /// Warm-up before measuring.
    pub ramp: Duration,
    /// Measured time.
    pub duration: Duration,
    /// Read responses with `UDP_GRO` (segmented responses arrive coalesced).
    pub gro: bool,
}

/// Why a population could not run.
#[derive(Debug, thiserror::Error)]
pub enum ClientsError {
    /// A bad client option.
    #[error(transparent)]
    Client(#[from] ClientConfigError),
    /// A bad population option.
    #[error("{0}")]
    Invalid(String),
    /// The server refuses responses this large.
    #[error("the server sends responses of at most {limit} payload bytes; {asked} were asked for")]
    Refused {
        /// Asked for.
        asked: u32,
        /// The server's limit.
        limit: u32,
    },
    /// A system call failed while setting up.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
}

impl ClientsConfig {
    /// Checks every option before anything is built.
    pub fn validate(&self) -> Result<(), ClientsError> {
        self.client.validate()?;
        let bad = |s: String| Err(ClientsError::Invalid(s));
        if !(1..=MAX_CLIENTS).contains(&self.clients) {
            return bad(format!("{} clients: must be 1..={MAX_CLIENTS}", self.clients));
        }
        if self.threads == 0 || self.threads > self.clients {
            return bad(format!("{} threads for {} clients: must be 1..=clients", self.threads, self.clients));
        }
        if self.duration.is_zero() {
            return bad("the measured time must be positive".into());
        }
        if !self.client.echo && self.client.response_len as usize > MAX_DATAGRAM * 255 {
            return bad(format!("response size {}: too large", self.client.response_len));
        }
        match self.load {
            Load::Open { rate } if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) => bad(format!(
                "open-loop rate {rate}: must be a positive number of requests per second, at most {MAX_RATE}"
            )),
            Load::Closed { .. } if self.client.max_outstanding != 1 => {
                bad("a closed-loop client has one request in flight".into())
            }
            Load::Open { .. } if self.client.max_outstanding > MAX_OUTSTANDING => {
                bad(format!("at most {MAX_OUTSTANDING} requests in flight per client"))
            }
            _ => Ok(()),
        }
    }
}

/// What a population measured.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct ClientsReport {
    /// Server address.
    pub server: String,
    /// Clients.
    pub clients: usize,
    /// Threads.
    pub threads: usize,
    /// "closed" or "open".
    pub load: String,
    /// Measured seconds.
    pub seconds: f64,
    /// Requests started in the measured time (first transmissions).
    pub requests: u64,
    /// Responses completed in the measured time.
    pub responses: u64,
    /// Responses per second.
    pub responses_per_s: f64,
    /// Latency from a request's first transmission to its whole response, ns.
    pub latency_ns: Summary,
    /// Retransmissions.
    pub retransmits: u64,
    /// Requests the server asked to be sent again with its cookie (once per client,
    /// unless a cookie expired).
    pub server_retries: u64,
    /// Requests given up after their last retransmission.
    pub lost: u64,
    /// Responses to requests no longer in flight.
    pub late: u64,
    /// Duplicate segments or responses.
    pub duplicates: u64,
    /// Datagrams that failed the checksum or format.
    pub corrupt: u64,
    /// Valid datagrams that did not match their request (size, segments, payload).
    pub mismatched: u64,
    /// Open loop: arrivals that found every client at its limit (not sent).
    pub arrivals_dropped: u64,
    /// Send errors (ICMP unreachable reported on the socket, buffer full ...).
    pub send_errors: u64,
    /// Receive errors (ICMP port unreachable shows up here on a connected socket).
    pub recv_errors: u64,
    /// Requests still in flight at the end (neither answered nor given up).
    pub in_flight_at_end: u64,
    /// CPU seconds of the client threads in the measured time.
    pub cpu_s: f64,
    /// Returns of the client threads' epoll waits with sockets ready, in the measured
    /// time: how often responses woke the clients.
    pub wakeups: u64,
    /// Ready sockets over those wake-ups (clients woken together: a herd when many).
    pub woken_sockets: u64,
    /// Most sockets ready in one wake-up.
    pub max_woken_sockets: u64,
    /// Sockets woken in wake-ups of at least [`HERD`] ready sockets.
    pub herd_woken_sockets: u64,
}

/// Ready sockets in one wake-up from which the clients count it as a herd.
pub const HERD: u64 = 8;

/// Runs the population until the measured time has passed or `stop` is set.
pub fn run(cfg: &ClientsConfig, stop: &AtomicBool) -> Result<ClientsReport, ClientsError> {
    cfg.validate()?;
    let per = |t: usize| cfg.clients / cfg.threads + usize::from(t < cfg.clients % cfg.threads);
    // Sockets are made here, before any thread starts, so a failure is an error of the
    // whole run.
    let mut groups = Vec::new();
    let mut first = 0;
    for t in 0..cfg.threads {
        let n = per(t);
        let mut socks = Vec::with_capacity(n);
        for _ in 0..n {
            socks.push(
                socket(cfg)
                    .map_err(|source| ClientsError::Io(netlane::error::IoError::new("client socket", source)))?,
            );
        }
        groups.push((first, socks));
        first += n;
    }
    let start_ns = monotonic_ns();
    let measure_from = start_ns + cfg.ramp.as_nanos() as u64;
    let measure_to = measure_from + cfg.duration.as_nanos() as u64;
    let results: Vec<io::Result<Part>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(t, (first, socks))| {
                let cpu = cfg.cpus.as_ref().and_then(|c| c.nth_wrapping(t));
                s.spawn(move || {
                    netlane::cpus::pin(cpu);
                    Worker::new(cfg, t, first, socks, measure_from, measure_to).run(stop)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(io::Error::other("client thread panicked"))))
            .collect()
    });
    let mut hist = Hist::new();
    let mut rep = ClientsReport {
        server: cfg.server.to_string(),
        clients: cfg.clients,
        threads: cfg.threads,
        load: match cfg.load {
            Load::Closed { .. } => "closed".into(),
            Load::Open { .. } => "open".into(),
        },
        ..ClientsReport::default()
    };
    let mut end_ns = measure_from;
    for r in results {
        let p = r.map_err(|source| ClientsError::Io(netlane::error::IoError::new("client thread", source)))?;
        if let Some(limit) = p.refused {
            return Err(ClientsError::Refused { asked: cfg.client.response_len, limit });
        }
        hist.merge(&p.hist);
        let d = p.measured;
        rep.requests += d.requests;
        rep.responses += d.responses;
        rep.retransmits += d.retransmits;
        rep.server_retries += d.retried;
        rep.lost += d.lost;
        rep.late += d.late;
        rep.duplicates += d.duplicates;
        rep.corrupt += d.corrupt;
        rep.mismatched += d.mismatched;
        rep.arrivals_dropped += p.arrivals_dropped;
        rep.send_errors += p.send_errors;
        rep.recv_errors += p.recv_errors;
        rep.in_flight_at_end += p.in_flight;
        rep.cpu_s += p.cpu_s;
        rep.wakeups += p.wakeups;
        rep.woken_sockets += p.woken_sockets;
        rep.max_woken_sockets = rep.max_woken_sockets.max(p.max_woken_sockets);
        rep.herd_woken_sockets += p.herd_woken_sockets;
        end_ns = end_ns.max(p.end_ns);
    }
    rep.seconds = end_ns.saturating_sub(measure_from) as f64 / 1e9;
    rep.responses_per_s = if rep.seconds > 0.0 { rep.responses as f64 / rep.seconds } else { 0.0 };
    rep.latency_ns = hist.summary();
    Ok(rep)
}

fn socket(cfg: &ClientsConfig) -> io::Result<UdpSocket> {
    let s = UdpSocket::connect_to(cfg.server)?;
    s.socket().set_nonblocking(true)?;
    if cfg.gro {
        s.enable_gro()?;
    }
    // Room for a whole response (and a retransmission's second one) per client.
    let want = (2 * (cfg.client.response_len as usize + 64 * 1024)).max(256 * 1024);
    let _ = s.set_recv_buffer(want);
    Ok(s)
}

/// One thread's result.
struct Part {
    hist: Hist,
    measured: ClientStats,
    arrivals_dropped: u64,
    send_errors: u64,
    recv_errors: u64,
    in_flight: u64,
    cpu_s: f64,
    end_ns: u64,
    wakeups: u64,
    woken_sockets: u64,
    max_woken_sockets: u64,
    herd_woken_sockets: u64,
    refused: Option<u32>,
}

struct Worker<'a> {
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
    fn new(
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
            rng: 0x9e37_79b9_7f4a_7c15 ^ (thread as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed69),
        }
    }

    fn run(mut self, stop: &AtomicBool) -> io::Result<Part> {
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
        let (mut wakeups, mut woken, mut max_woken, mut herd) = (0u64, 0u64, 0u64, 0u64);
        loop {
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
            if n > 0 && self.at_start.is_some() {
                wakeups += 1;
                woken += n as u64;
                max_woken = max_woken.max(n as u64);
                if n as u64 >= HERD {
                    herd += n as u64;
                }
            }
            for ev in &events[..n] {
                self.drain(ev.data() as usize);
            }
        }
        let base = self.at_start.take().unwrap_or_else(|| self.clients.iter().map(Client::stats).collect());
        let mut measured = ClientStats::default();
        for (c, b) in self.clients.iter().zip(&base) {
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
        Ok(Part {
            hist: self.hist,
            measured,
            arrivals_dropped: self.arrivals_dropped,
            send_errors: self.send_errors,
            recv_errors: self.recv_errors,
            in_flight: self.clients.iter().map(|c| c.in_flight() as u64).sum(),
            cpu_s: thread_cpu().total_s() - cpu0.total_s(),
            end_ns: end_ns.min(self.measure_to),
            wakeups,
            woken_sockets: woken,
            max_woken_sockets: max_woken,
            herd_woken_sockets: herd,
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
