//! The client population: N clients, each with its own UDP socket (so the server sees N
//! 4-tuples), many per thread, driven by epoll.
//!
//! Closed loop (the talk's workload): a client sends a request, waits for its response,
//! thinks, and sends the next. Open loop: requests arrive at a Poisson rate whatever the
//! responses do, spread over the clients round-robin (each may then have several in
//! flight); an arrival that finds every client at its limit is counted, not lost
//! silently. Every client retransmits on timeout and gives up after its retries; late,
//! duplicate, corrupted and misassembled responses are counted, never accepted.
//!
//! Files: this one the options, the report and the run (sockets made, threads started,
//! their parts added up); `worker.rs` one client thread.

mod agents;
mod tcp;
mod worker;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use netlane::cpus::CpuList;
use netlane::metrics::Summary;
use netlane::metrics::hist::Hist;
use netlane::metrics::run_status::{RunStatus, Window, watch};
use netlane::time::monotonic_ns;
use netlane::udp::UdpSocket;
use serde::{Deserialize, Serialize};

pub use self::agents::{AgentOutput, merge, split};
use self::tcp::TcpWorker;
use self::worker::{Part, Worker};
use crate::proto::client::{ClientConfig, ClientConfigError, MAX_OUTSTANDING};
use crate::proto::wire::MAX_DATAGRAM;
pub use crate::server::Transport;

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
    /// Mixed into the open loop's arrival times (agents of one measurement each have
    /// their own, so their arrivals are not the same).
    pub seed: u64,
    /// A datagram socket per client, or a TCP connection per client (closed loop).
    pub transport: Transport,
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
            Load::Open { .. } if self.transport == Transport::Tcp => {
                bad("TCP clients run a closed loop: each its connection, one request in flight".into())
            }
            _ if self.transport == Transport::Tcp && self.gro => {
                bad("UDP_GRO is for datagram clients, not TCP connections".into())
            }
            _ => Ok(()),
        }
    }
}

/// What a population measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Sockets woken in wake-ups of at least 8 ready sockets (a herd).
    pub herd_woken_sockets: u64,
}

/// Ready sockets in one wake-up from which the clients count it as a herd.
pub const HERD: u64 = 8;

/// The latency at quantile `q` of a run whose `hist` holds its answers' latencies and
/// `unanswered` requests got none (given up as lost): each ranks above
/// every answer, so it can only make a percentile worse (`None`: the rank falls among
/// them, or nothing was asked).
pub fn latency_at(hist: &Hist, unanswered: u64, q: f64) -> Option<u64> {
    let answered = hist.count();
    let total = answered.saturating_add(unanswered);
    if total == 0 {
        return None;
    }
    // The product is made a hair smaller first: p7 of 100 is rank 7, not 8 (0.07 * 100
    // is 7.000000000000001 in floating point).
    let rank = ((q.clamp(0.0, 1.0) * total as f64 * (1.0 - 1e-12)).ceil() as u64).max(1);
    // Asked half a rank below, the histogram's own rounding up lands on this rank.
    (rank <= answered).then(|| hist.quantile((rank as f64 - 0.5) / answered as f64))
}

/// Runs the population until the measured time has passed or `stop` is set.
pub fn run(cfg: &ClientsConfig, stop: &AtomicBool) -> Result<ClientsReport, ClientsError> {
    run_gated(cfg, stop, || Ok(())).map(|(report, _)| report)
}

/// [`run`] with its latencies, telling `status` where it is as it goes (completed:
/// responses measured).
pub fn run_observed(
    cfg: &ClientsConfig,
    stop: &AtomicBool,
    status: &mut dyn FnMut(&RunStatus),
) -> Result<(ClientsReport, Hist), ClientsError> {
    run_inner(cfg, stop, || Ok(()), Some(status))
}

/// [`run`], with `gate` called once every socket is made and before anything is sent
/// (an agent says it is ready there and waits for its start); also the latencies.
pub fn run_gated(
    cfg: &ClientsConfig,
    stop: &AtomicBool,
    gate: impl FnOnce() -> Result<(), ClientsError>,
) -> Result<(ClientsReport, Hist), ClientsError> {
    run_inner(cfg, stop, gate, None)
}

fn run_inner(
    cfg: &ClientsConfig,
    stop: &AtomicBool,
    gate: impl FnOnce() -> Result<(), ClientsError>,
    status: Option<&mut dyn FnMut(&RunStatus)>,
) -> Result<(ClientsReport, Hist), ClientsError> {
    cfg.validate()?;
    let per = |t: usize| cfg.clients / cfg.threads + usize::from(t < cfg.clients % cfg.threads);
    // Sockets are made here, before any thread starts, so a failure is an error of the
    // whole run.
    let mut groups = Vec::new();
    let mut first = 0;
    for t in 0..cfg.threads {
        let n = per(t);
        let group = match cfg.transport {
            Transport::Udp => Group::Udp(
                (0..n)
                    .map(|_| socket(cfg))
                    .collect::<io::Result<_>>()
                    .map_err(|source| ClientsError::Io(netlane::error::IoError::new("client socket", source)))?,
            ),
            Transport::Tcp => {
                Group::Tcp((0..n).map(|_| connection(cfg)).collect::<io::Result<_>>().map_err(|source| {
                    let what = format!("a client's TCP connection to {}", cfg.server);
                    ClientsError::Io(netlane::error::IoError::new(what, source))
                })?)
            }
        };
        groups.push((first, group));
        first += n;
    }
    gate()?;
    let start_ns = monotonic_ns();
    let measure_from = start_ns + cfg.ramp.as_nanos() as u64;
    let measure_to = measure_from + cfg.duration.as_nanos() as u64;
    let answered = AtomicU64::new(0);
    let answered = &answered;
    let results: Vec<io::Result<Part>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(t, (first, group))| {
                let cpu = cfg.cpus.as_ref().and_then(|c| c.nth_wrapping(t));
                s.spawn(move || {
                    netlane::cpus::pin(cpu);
                    match group {
                        Group::Udp(socks) => {
                            Worker::new(cfg, t, first, socks, measure_from, measure_to).run(stop, answered)
                        }
                        Group::Tcp(streams) => {
                            TcpWorker::new(cfg, first, streams, measure_from, measure_to).run(stop, answered)
                        }
                    }
                })
            })
            .collect();
        if let Some(status) = status {
            let window = Window { start_ns, measure_from_ns: measure_from, end_ns: measure_to };
            watch(window, answered, || !handles.iter().all(|h| h.is_finished()), status);
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(io::Error::other("client thread panicked"))))
            .collect()
    });
    let mut hist = Hist::new();
    let mut rep = ClientsReport::empty(cfg);
    let mut end_ns = measure_from;
    for r in results {
        let p = r.map_err(|source| ClientsError::Io(netlane::error::IoError::new("client thread", source)))?;
        if let Some(limit) = p.refused {
            return Err(ClientsError::Refused { asked: cfg.client.response_len, limit });
        }
        hist.merge(&p.hist);
        let d = p.measured;
        rep.add(&ClientsReport {
            requests: d.requests,
            responses: d.responses,
            retransmits: d.retransmits,
            server_retries: d.retried,
            lost: d.lost,
            late: d.late,
            duplicates: d.duplicates,
            corrupt: d.corrupt,
            mismatched: d.mismatched,
            arrivals_dropped: p.arrivals_dropped,
            send_errors: p.send_errors,
            recv_errors: p.recv_errors,
            in_flight_at_end: p.in_flight,
            cpu_s: p.cpu_s,
            wakeups: p.woken.wakeups,
            woken_sockets: p.woken.sockets,
            max_woken_sockets: p.woken.max_sockets,
            herd_woken_sockets: p.woken.herd_sockets,
            ..ClientsReport::default()
        });
        end_ns = end_ns.max(p.end_ns);
    }
    rep.finish(end_ns.saturating_sub(measure_from) as f64 / 1e9, &hist);
    Ok((rep, hist))
}

impl ClientsReport {
    /// `cfg`'s report before anything is counted.
    fn empty(cfg: &ClientsConfig) -> ClientsReport {
        ClientsReport {
            server: cfg.server.to_string(),
            clients: cfg.clients,
            threads: cfg.threads,
            load: match cfg.load {
                Load::Closed { .. } => "closed".into(),
                Load::Open { .. } => "open".into(),
            },
            ..ClientsReport::default()
        }
    }

    /// Adds `o`'s counts (saturating: an agent's counts may be anything) and CPU.
    fn add(&mut self, o: &ClientsReport) {
        let pairs = [
            (&mut self.requests, o.requests),
            (&mut self.responses, o.responses),
            (&mut self.retransmits, o.retransmits),
            (&mut self.server_retries, o.server_retries),
            (&mut self.lost, o.lost),
            (&mut self.late, o.late),
            (&mut self.duplicates, o.duplicates),
            (&mut self.corrupt, o.corrupt),
            (&mut self.mismatched, o.mismatched),
            (&mut self.arrivals_dropped, o.arrivals_dropped),
            (&mut self.send_errors, o.send_errors),
            (&mut self.recv_errors, o.recv_errors),
            (&mut self.in_flight_at_end, o.in_flight_at_end),
            (&mut self.wakeups, o.wakeups),
            (&mut self.woken_sockets, o.woken_sockets),
            (&mut self.herd_woken_sockets, o.herd_woken_sockets),
        ];
        for (mine, theirs) in pairs {
            *mine = mine.saturating_add(theirs);
        }
        self.max_woken_sockets = self.max_woken_sockets.max(o.max_woken_sockets);
        self.cpu_s += o.cpu_s;
    }

    /// Sets the measured time, the rate over it and the latencies of `hist`.
    fn finish(&mut self, seconds: f64, hist: &Hist) {
        self.seconds = seconds;
        self.responses_per_s = if seconds > 0.0 { self.responses as f64 / seconds } else { 0.0 };
        self.latency_ns = hist.summary();
    }
}

/// One thread's clients: their sockets or connections.
enum Group {
    Udp(Vec<UdpSocket>),
    Tcp(Vec<std::net::TcpStream>),
}

/// How long a client's connection may take to be made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client's connection: made before any thread starts, non-blocking, no Nagle delay
/// (each request goes as it is written).
fn connection(cfg: &ClientsConfig) -> io::Result<std::net::TcpStream> {
    let s = std::net::TcpStream::connect_timeout(&cfg.server, CONNECT_TIMEOUT)?;
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    Ok(s)
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
