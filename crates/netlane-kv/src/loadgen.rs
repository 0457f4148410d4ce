//! The load generator's driver: threads, TCP connections, a timer, over the sans-IO
//! [`load`](crate::load) core. Works against any memcached-protocol server.
//!
//! Each thread owns a share of the connections, one epoll instance and one timerfd
//! armed (absolute `CLOCK_MONOTONIC`, nanoseconds) for the earliest send due among its
//! connections; due requests are written as soon as the thread wakes, replies are read
//! when epoll says so. Send times come from the precomputed schedule and latency is
//! measured from them, so the generator's own delays count against the server, never
//! for it: a late send is counted (`sent_late`), and the thread CPU time is reported so
//! a run can show the generator was not the bottleneck.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use serde::Serialize;

use crate::load::codec::{Codec, Reply, SetReply};
use crate::load::conn::{ConnConfig, Connection};
use crate::load::rng::Rng;
use crate::load::schedule::{Arrivals, Pacing};
use crate::load::search::{Outcome, Point, RateSearch, SearchConfig, Verdict, Vote, decided, judge};
use crate::load::stats::{Counts, Measurement, REPORTED_QUANTILES, Sla, Stats};
use crate::load::workload::{Workload, WorkloadSpec};
use netlane::time::monotonic_ns;

/// What a run does.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The server.
    pub server: SocketAddr,
    /// TCP connections.
    pub connections: u32,
    /// Threads the connections are spread over.
    pub threads: usize,
    /// CPUs the threads are pinned to (thread i on the i-th, wrapping).
    pub cpus: Option<Vec<usize>>,
    /// Open loop at a total rate, or closed loop at a depth per connection.
    pub pacing: Pacing,
    /// What is asked.
    pub workload: WorkloadSpec,
    /// How long requests are measured.
    pub duration: Duration,
    /// Before that, how long requests are sent but not measured (connections and
    /// caches settle; the first requests on a connection are slower).
    pub ramp: Duration,
    /// Most requests in flight per connection.
    pub max_in_flight: u32,
    /// A send this much after its scheduled time counts as late.
    pub late_after: Duration,
    /// After the window, how long replies are still awaited (then: unanswered).
    pub drain: Duration,
    /// The seed of every random draw.
    pub seed: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            server: SocketAddr::from(([127, 0, 0, 1], 11211)),
            connections: 64,
            threads: 1,
            cpus: None,
            pacing: Pacing::Open(Arrivals { process: crate::load::schedule::Process::Poisson, rate_per_s: 10_000.0 }),
            workload: WorkloadSpec::default(),
            duration: Duration::from_secs(5),
            ramp: Duration::from_millis(200),
            max_in_flight: 64,
            late_after: Duration::from_micros(100),
            drain: Duration::from_secs(1),
            seed: 1,
        }
    }
}

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A bad value.
    #[error("{0}")]
    Config(String),
    /// A connection or system call failed.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
    /// The warm-up did not store every key.
    #[error("warm-up: {0}")]
    Warmup(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LoadError {
    let what = what.into();
    move |source| LoadError::Io(netlane::error::IoError::new(what, source))
}

impl LoadConfig {
    /// Checks the values before anything connects.
    pub fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::Config(m));
        if !(1..=65_536).contains(&self.connections) {
            return bad(format!("`connections` {}: must be 1..=65536", self.connections));
        }
        if !(1..=256).contains(&self.threads) || self.threads > self.connections as usize {
            return bad(format!("`threads` {}: must be 1..=256 and at most the connections", self.threads));
        }
        if self.duration < Duration::from_millis(10) || self.duration > Duration::from_secs(24 * 3600) {
            return bad("`duration` must be 10ms..=24h".into());
        }
        if self.ramp > Duration::from_secs(60) {
            return bad("`ramp` must be at most 60s".into());
        }
        if self.drain > Duration::from_secs(60) {
            return bad("`drain` must be at most 60s".into());
        }
        if !(1..=4096).contains(&self.max_in_flight) {
            return bad(format!("`max_in_flight` {}: must be 1..=4096", self.max_in_flight));
        }
        match self.pacing {
            Pacing::Open(a) => {
                a.per_connection(self.connections).map_err(|e| LoadError::Config(e.to_string()))?;
            }
            Pacing::Closed { depth } if depth == 0 || depth > self.max_in_flight => {
                return bad(format!("`closed` {depth}: must be 1..=`max_in_flight` ({})", self.max_in_flight));
            }
            Pacing::Closed { .. } => {}
        }
        Workload::new(self.workload).map_err(|e| LoadError::Config(e.to_string()))?;
        if let Some(c) = &self.cpus {
            netlane::cpus::CpuList::new(c.clone()).check_online().map_err(|e| LoadError::Config(e.to_string()))?;
        }
        Ok(())
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct LoadReport {
    /// Open or closed loop.
    pub mode: &'static str,
    /// The offered rate asked for (open loop), requests/s.
    pub target_per_s: Option<f64>,
    /// Length of the measured window, s (after the ramp).
    pub seconds: f64,
    /// Requests offered per second of the window.
    pub offered_per_s: f64,
    /// Requests completed per second of the window.
    pub achieved_per_s: f64,
    /// Every counter.
    pub counts: CountsView,
    /// Latency at p50, p90, p99, p99.9, p99.99, µs; `None` where the percentile falls
    /// among requests without a good answer.
    pub latency_us: Vec<(String, Option<f64>)>,
    /// Mean latency of the completed requests, µs.
    pub mean_us: Option<f64>,
    /// Share of sends later than the lateness tolerance after their scheduled time (the
    /// server's delay included: a connection with every slot in flight waits).
    pub late_share: f64,
    /// Share of sends the generator itself delayed past the tolerance, after they could
    /// go: above a few percent the run measured the generator.
    pub lag_share: f64,
    /// Connections that failed during the run.
    pub connection_failures: u64,
    /// CPU time of the generator's threads (user + system), s.
    pub client_cpu_s: f64,
    /// That CPU time over the threads' wall time: near 1.0, the generator itself may be
    /// the bottleneck.
    pub client_cpu_busy: f64,
}

impl LoadReport {
    /// Why the run measured nothing it can be trusted for, if so: no request answered,
    /// a connection lost, or most requests never sent.
    pub fn failure(&self) -> Option<String> {
        let c = &self.counts;
        if c.completed == 0 {
            Some("no request was answered".into())
        } else if self.connection_failures > 0 {
            Some(format!("{} connections failed during the run ({} requests lost)", self.connection_failures, c.lost))
        } else if c.not_sent * 2 > c.offered {
            Some(format!("{} of {} requests were never sent", c.not_sent, c.offered))
        } else {
            None
        }
    }
}

/// [`Counts`] for serialization.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CountsView {
    /// Scheduled.
    pub offered: u64,
    /// Written out.
    pub sent: u64,
    /// Written out late.
    pub sent_late: u64,
    /// Written out late by the generator's own delay.
    pub sent_lagged: u64,
    /// Answered without an error.
    pub completed: u64,
    /// Keys found.
    pub hits: u64,
    /// Keys not found.
    pub misses: u64,
    /// Sets stored.
    pub stored: u64,
    /// Error replies (ERROR, CLIENT_ERROR, SERVER_ERROR).
    pub errors: u64,
    /// In flight when their connection failed.
    pub lost: u64,
    /// In flight at the end.
    pub unanswered: u64,
    /// Never sent.
    pub not_sent: u64,
}

impl From<&Counts> for CountsView {
    fn from(c: &Counts) -> Self {
        CountsView {
            offered: c.offered,
            sent: c.sent,
            sent_late: c.sent_late,
            sent_lagged: c.sent_lagged,
            completed: c.completed,
            hits: c.hits,
            misses: c.misses,
            stored: c.stored,
            errors: c.error + c.client_error + c.server_error,
            lost: c.lost,
            unanswered: c.unanswered,
            not_sent: c.not_sent,
        }
    }
}

/// The result of a run, with its full statistics (for an SLA verdict).
#[derive(Debug)]
pub struct Run {
    /// The summary.
    pub report: LoadReport,
    /// Counters and histogram.
    pub stats: Stats,
}

fn connect(addr: SocketAddr) -> Result<TcpStream, LoadError> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io_err(format!("connect to {addr}")))?;
    s.set_nodelay(true).map_err(io_err("TCP_NODELAY"))?;
    Ok(s)
}

/// Stores every key of the workload once (pipelined, over up to 8 connections), so
/// gets hit. Every set must be answered STORED. Returns the keys stored.
pub fn warm_up(cfg: &LoadConfig) -> Result<u64, LoadError> {
    let workload = Workload::new(cfg.workload).map_err(|e| LoadError::Config(e.to_string()))?;
    let lanes = 8.min(cfg.connections as usize).max(1);
    let keys = workload.spec().keys;
    let results: Vec<Result<u64, LoadError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..lanes)
            .map(|lane| {
                let workload = &workload;
                sc.spawn(move || warm_lane(cfg.server, workload, lane as u64, lanes as u64))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(LoadError::Warmup("thread panicked".into()))))
            .collect()
    });
    let mut stored = 0;
    for r in results {
        stored += r?;
    }
    if stored != keys {
        return Err(LoadError::Warmup(format!("{stored} of {keys} keys stored")));
    }
    Ok(stored)
}

fn warm_lane(server: SocketAddr, workload: &Workload, lane: u64, lanes: u64) -> Result<u64, LoadError> {
    let mut s = connect(server)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(io_err("read timeout"))?;
    let mut codec = Codec::new(workload.spec().item_max);
    let (mut out, mut buf) = (Vec::new(), vec![0u8; 65536]);
    let (mut stored, mut bad) = (0u64, None);
    let mut pending = 0usize;
    let requests = workload.warmup().enumerate().filter(|(i, _)| *i as u64 % lanes == lane).map(|(_, r)| r);
    let mut requests = requests.peekable();
    while requests.peek().is_some() || pending > 0 {
        out.clear();
        while pending < 64
            && let Some(r) = requests.next()
        {
            codec.encode(0, &r, &mut out);
            pending += 1;
        }
        s.write_all(&out).map_err(io_err("warm-up write"))?;
        let n = s.read(&mut buf).map_err(io_err("warm-up read"))?;
        if n == 0 {
            return Err(LoadError::Warmup("the server closed the connection".into()));
        }
        codec
            .decode(&buf[..n], |c| {
                pending -= 1;
                match c.reply {
                    Reply::Set(SetReply::Stored) => stored += 1,
                    other => bad = Some(format!("{other:?}")),
                }
            })
            .map_err(|e| LoadError::Warmup(e.to_string()))?;
        if let Some(b) = &bad {
            return Err(LoadError::Warmup(format!("a set was answered {b}")));
        }
    }
    Ok(stored)
}

struct Peer {
    stream: Option<TcpStream>,
    conn: Option<Connection>,
    /// Bytes written to the socket later (it was full).
    pending: Vec<u8>,
    /// The due time this connection is queued under.
    queued: Option<u64>,
}

const TIMER: u64 = u64::MAX;

struct ThreadResult {
    stats: Stats,
    failures: u64,
    cpu_s: f64,
    wall_s: f64,
}

fn thread_cpu_s() -> f64 {
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0.0, |r| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(r.user_time()) + t(r.system_time())
    })
}

/// Runs the load for `cfg.duration` (or until `stop`), then waits `cfg.drain` for the
/// last replies.
pub fn run(cfg: &LoadConfig, stop: &AtomicBool) -> Result<Run, LoadError> {
    cfg.validate()?;
    let workload = Workload::new(cfg.workload).map_err(|e| LoadError::Config(e.to_string()))?;
    let pacing = match cfg.pacing {
        Pacing::Open(a) => {
            Pacing::Open(a.per_connection(cfg.connections).map_err(|e| LoadError::Config(e.to_string()))?)
        }
        p => p,
    };
    // Connect everything first; the window starts once all threads are ready.
    let mut streams: Vec<Vec<(u32, TcpStream)>> = (0..cfg.threads).map(|_| Vec::new()).collect();
    for i in 0..cfg.connections {
        let s = connect(cfg.server)?;
        s.set_nonblocking(true).map_err(io_err("non-blocking"))?;
        streams[i as usize % cfg.threads].push((i, s));
    }
    let barrier = Arc::new(Barrier::new(cfg.threads));
    let start_ns = monotonic_ns() + 50_000_000;
    let measure_from_ns = start_ns + cfg.ramp.as_nanos() as u64;
    let end_ns = measure_from_ns + cfg.duration.as_nanos() as u64;
    let results: Vec<Result<ThreadResult, LoadError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(t, mine)| {
                let (workload, barrier) = (workload.clone(), barrier.clone());
                let cpu = cfg.cpus.as_ref().and_then(|c| (!c.is_empty()).then(|| c[t % c.len()]));
                let cc = ConnConfig {
                    pacing,
                    start_ns,
                    end_ns,
                    max_in_flight: cfg.max_in_flight,
                    late_after_ns: cfg.late_after.as_nanos() as u64,
                    measure_from_ns,
                    max_value_len: cfg.workload.item_max,
                };
                let (seed, drain) = (cfg.seed, cfg.drain);
                sc.spawn(move || {
                    netlane::cpus::pin(cpu);
                    barrier.wait();
                    drive(mine, &cc, &workload, seed, end_ns + drain.as_nanos() as u64, stop)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(LoadError::Config("a load thread panicked".into()))))
            .collect()
    });
    let mut stats = Stats::new();
    let (mut failures, mut cpu, mut wall) = (0, 0.0, 0.0);
    for r in results {
        let r = r?;
        stats.merge(&r.stats);
        failures += r.failures;
        cpu += r.cpu_s;
        wall += r.wall_s;
    }
    let seconds = cfg.duration.as_secs_f64();
    let c = *stats.counts();
    let latency_us = REPORTED_QUANTILES
        .iter()
        .map(|q| (format!("p{}", q * 100.0), stats.latency_at(*q).map(|ns| ns as f64 / 1e3)))
        .collect();
    let report = LoadReport {
        mode: if matches!(cfg.pacing, Pacing::Open(_)) { "open" } else { "closed" },
        target_per_s: match cfg.pacing {
            Pacing::Open(a) => Some(a.rate_per_s),
            Pacing::Closed { .. } => None,
        },
        seconds,
        offered_per_s: c.offered as f64 / seconds,
        achieved_per_s: c.completed as f64 / seconds,
        counts: CountsView::from(&c),
        latency_us,
        mean_us: stats.mean_latency().map(|ns| ns / 1e3),
        late_share: if c.sent == 0 { 0.0 } else { c.sent_late as f64 / c.sent as f64 },
        lag_share: c.lag_share(),
        connection_failures: failures,
        client_cpu_s: cpu,
        client_cpu_busy: if wall > 0.0 { cpu / wall } else { 0.0 },
    };
    Ok(Run { report, stats })
}

/// One thread's event loop.
fn drive(
    mine: Vec<(u32, TcpStream)>,
    cc: &ConnConfig,
    workload: &Workload,
    seed: u64,
    until_ns: u64,
    stop: &AtomicBool,
) -> Result<ThreadResult, LoadError> {
    let (cpu0, wall0) = (thread_cpu_s(), monotonic_ns());
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| io_err("epoll")(e.into()))?;
    let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
        .map_err(|e| io_err("timerfd")(e.into()))?;
    epoll.add(timer.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TIMER)).map_err(|e| io_err("epoll add")(e.into()))?;
    let mut stats = Stats::new();
    let mut peers = Vec::with_capacity(mine.len());
    for (i, (id, s)) in mine.into_iter().enumerate() {
        epoll
            .add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(|e| io_err("epoll add")(e.into()))?;
        let conn = Connection::new(cc, workload.clone(), Rng::stream(seed, u64::from(id)))
            .map_err(|e| LoadError::Config(e.to_string()))?;
        peers.push(Peer { stream: Some(s), conn: Some(conn), pending: Vec::new(), queued: None });
    }
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    // A connection is queued under its next due time while it can send: never after its
    // socket failed (what it would have sent counts as not sent at the end), or the loop
    // below would pop and push it again for ever.
    let requeue = |p: &mut Peer, i: usize, heap: &mut BinaryHeap<Reverse<(u64, usize)>>| {
        let due = p.stream.as_ref().and(p.conn.as_ref()).and_then(Connection::next_due);
        if due != p.queued {
            p.queued = due;
            if let Some(d) = due {
                heap.push(Reverse((d, i)));
            }
        }
    };
    for (i, p) in peers.iter_mut().enumerate() {
        requeue(p, i, &mut heap);
    }
    let mut failures = 0u64;
    let mut out = Vec::with_capacity(4096);
    let mut buf = vec![0u8; 256 << 10];
    let mut events = vec![EpollEvent::empty(); 256];
    let mut armed = None;
    loop {
        let now = monotonic_ns();
        if now >= until_ns || stop.load(Ordering::Relaxed) {
            break;
        }
        // Everything due goes out now.
        while let Some(&Reverse((due, i))) = heap.peek() {
            if due > now {
                break;
            }
            heap.pop();
            let p = &mut peers[i];
            if p.queued != Some(due) {
                continue;
            }
            p.queued = None;
            if let (Some(conn), Some(_)) = (p.conn.as_mut(), p.stream.as_ref()) {
                out.clear();
                conn.poll_transmit(now, &mut out, &mut stats);
                p.pending.extend_from_slice(&out);
                if !flush(p) {
                    fail(p, now, &mut stats, &mut failures);
                }
            }
            requeue(p, i, &mut heap);
        }
        let next = heap.peek().map_or(until_ns, |r| r.0.0).min(until_ns);
        // Re-armed only when it must fire earlier, or has fired: a timer set for a
        // deadline already passed (the sends were made) wakes the thread once for
        // nothing, cheaper than a timerfd_settime per send.
        if armed.is_none_or(|a| next < a) {
            let ts = TimeSpec::new((next / 1_000_000_000) as _, (next % 1_000_000_000) as _);
            timer
                .set(Expiration::OneShot(ts), TimerSetTimeFlags::TFD_TIMER_ABSTIME)
                .map_err(|e| io_err("timerfd set")(e.into()))?;
            armed = Some(next);
        }
        let n = match epoll.wait(&mut events, EpollTimeout::from(100u16)) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => 0,
            Err(e) => return Err(io_err("epoll_wait")(e.into())),
        };
        let now = monotonic_ns();
        for ev in &events[..n] {
            let i = ev.data();
            if i == TIMER {
                let _ = timer.wait();
                armed = None;
                continue;
            }
            let i = i as usize;
            let p = &mut peers[i];
            if !p.pending.is_empty() && !flush(p) {
                fail(p, now, &mut stats, &mut failures);
                continue;
            }
            let Some(s) = p.stream.as_mut() else { continue };
            let ok = match s.read(&mut buf) {
                Ok(0) => false,
                Ok(m) => p.conn.as_mut().is_some_and(|c| c.handle_input(now, &buf[..m], &mut stats).is_ok()),
                Err(e) => e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted,
            };
            if !ok {
                fail(p, now, &mut stats, &mut failures);
            }
            requeue(p, i, &mut heap);
        }
    }
    for p in peers {
        if let Some(c) = p.conn {
            c.finish(&mut stats);
        }
    }
    Ok(ThreadResult { stats, failures, cpu_s: thread_cpu_s() - cpu0, wall_s: (monotonic_ns() - wall0) as f64 / 1e9 })
}

/// Writes what is pending; false when the connection broke.
fn flush(p: &mut Peer) -> bool {
    let Some(s) = p.stream.as_mut() else { return false };
    while !p.pending.is_empty() {
        match s.write(&p.pending) {
            Ok(n) => {
                p.pending.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// A connection broke: its requests in flight are lost; it sends nothing more (what it
/// would have sent counts as not sent at the end).
fn fail(p: &mut Peer, now: u64, stats: &mut Stats, failures: &mut u64) {
    if p.stream.take().is_some() {
        *failures += 1;
        if let Some(c) = p.conn.as_mut() {
            c.handle_disconnect(now, stats);
        }
    }
    p.pending.clear();
    p.queued = None;
}

/// A rate search's result.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SearchReport {
    /// The SLA, as given.
    pub sla: String,
    /// The highest offered rate that met it, confirmed by a second run (`None`: no rate
    /// did).
    pub best_per_s: Option<f64>,
    /// The best rate is the upper bound: the server may hold more.
    pub capped: bool,
    /// Above the best rate the generator could not keep its schedule: the server may
    /// hold more than the generator can offer.
    pub generator_limited: bool,
    /// The rates decided, in order: rate asked, offered, achieved, the SLA percentile
    /// (µs), verdict (each decided by three runs of five, or two clear ones).
    pub curve: Vec<CurvePoint>,
    /// Runs made (two to five per rate).
    pub runs: usize,
}

/// One run of a search.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CurvePoint {
    /// Rate asked for.
    pub rate_per_s: f64,
    /// Offered per second.
    pub offered_per_s: f64,
    /// Completed per second.
    pub achieved_per_s: f64,
    /// Latency at the SLA percentile, µs (`None`: among failed requests).
    pub sla_latency_us: Option<f64>,
    /// met, missed, fell-behind, idle or generator-bound.
    pub verdict: &'static str,
    /// A confirmation of an earlier rate.
    pub confirmation: bool,
}

fn curve_point(p: &Point) -> CurvePoint {
    CurvePoint {
        rate_per_s: p.rate_per_s,
        offered_per_s: p.measured.offered_per_s,
        achieved_per_s: p.measured.achieved_per_s,
        sla_latency_us: p.measured.sla_latency_ns.map(|n| n as f64 / 1e3),
        verdict: match p.verdict {
            Verdict::Met => "met",
            Verdict::SlaMissed => "missed",
            Verdict::FellBehind => "fell-behind",
            Verdict::Idle => "idle",
            Verdict::GeneratorBound => "generator-bound",
        },
        confirmation: p.confirmation,
    }
}

/// Finds the highest open-loop rate whose `sla` percentile holds: bisection over short
/// runs of `cfg.duration` at `cfg.pacing`'s arrival process, each rate decided by three
/// runs of five, or by two that agree far from the bound ([`decided`]), the best rate
/// decided again to confirm it.
/// `progress` sees every run as it ends.
/// Checks what a [`search`] is asked for before anything is sent (the warm-up
/// included).
pub fn check_search(cfg: &LoadConfig, range: SearchConfig) -> Result<(), LoadError> {
    if !matches!(cfg.pacing, Pacing::Open(_)) {
        return Err(LoadError::Config("a search needs open loop (a rate, not a closed loop)".into()));
    }
    RateSearch::new(range).map(|_| ()).map_err(|e| LoadError::Config(e.to_string()))
}

pub fn search(
    cfg: &LoadConfig,
    sla: Sla,
    range: SearchConfig,
    stop: &AtomicBool,
    mut progress: impl FnMut(&RunPoint),
) -> Result<SearchReport, LoadError> {
    let Pacing::Open(arrivals) = cfg.pacing else {
        return Err(LoadError::Config("a search needs open loop (a rate, not a closed loop)".into()));
    };
    let mut s = RateSearch::new(range).map_err(|e| LoadError::Config(e.to_string()))?;
    let mut run_cfg = cfg.clone();
    let mut runs = 0;
    while let Some(rate) = s.next_rate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        run_cfg.pacing = Pacing::Open(Arrivals { rate_per_s: rate, ..arrivals });
        // Each rate is verified (search::decided): three runs of five on one side, or
        // two that agree far from the bound. The search records a run of the winning side.
        let mut votes: Vec<Measurement> = Vec::new();
        let mut ballots: Vec<Vote> = Vec::new();
        let bound = sla.latency_ns() as f64;
        let held = loop {
            run_cfg.seed = run_cfg.seed.wrapping_add(1);
            let r = run(&run_cfg, stop)?;
            let m = r.stats.measure(&sla, cfg.duration.as_nanos() as u64);
            runs += 1;
            let held = holds(&m, rate);
            progress(&RunPoint { rate_per_s: rate, vote: votes.len() + 1, met: held, measured: m });
            let kept_up = matches!(judge(rate, &m), Verdict::Met | Verdict::SlaMissed);
            ballots.push(Vote { held, ratio: m.sla_latency_ns.filter(|_| kept_up).map(|ns| ns as f64 / bound) });
            votes.push(m);
            if let Some(d) = decided(&ballots) {
                break d;
            }
            if stop.load(Ordering::Relaxed) {
                break false;
            }
        };
        let chosen = votes.iter().rev().find(|v| holds(v, rate) == held).copied().unwrap_or(votes[0]);
        s.record(chosen).map_err(|e| LoadError::Config(e.to_string()))?;
    }
    let (best, capped, generator_limited) = match s.outcome() {
        Some(Outcome::Found { point, capped, generator_limited }) => {
            (Some(point.rate_per_s), capped, generator_limited)
        }
        _ => (None, false, false),
    };
    Ok(SearchReport {
        sla: sla.to_string(),
        best_per_s: best,
        capped,
        generator_limited,
        curve: s.curve().iter().map(curve_point).collect(),
        runs,
    })
}

/// One run of a search, as it ends.
#[derive(Debug, Clone, Copy)]
pub struct RunPoint {
    /// The rate asked for.
    pub rate_per_s: f64,
    /// Which run at this rate (1..=3).
    pub vote: usize,
    /// Whether it kept up and held the SLA.
    pub met: bool,
    /// What it measured.
    pub measured: Measurement,
}

/// Whether a run kept up with the rate and held the SLA: the search's own rule.
fn holds(m: &Measurement, rate: f64) -> bool {
    judge(rate, m) == Verdict::Met
}
