//! The NVMe/TCP target server.
//!
//! An acceptor thread hands each new connection to one reactor, round robin. Each
//! reactor is a thread pinned to its CPU with its own epoll set; it owns its connections
//! outright (the [`TargetQueue`] state machines, buffers and sockets), so the I/O path
//! takes no locks. A reactor round reads every ready socket and runs the state machines;
//! a connection whose output passes 256 KiB mid-round sends it with `MSG_MORE` (the
//! rest of its batch follows), and at the end of the round each connection's remaining
//! output goes out with `MSG_EOR`, which also uncorks what `MSG_MORE` held. With busy
//! polling the reactor spins on `epoll_wait` with a zero timeout (and sets
//! `SO_BUSY_POLL` on its sockets) instead of sleeping.
//!
//! Storage never blocks a reactor: the state machines emit storage requests, and the
//! reactor runs those of namespaces that cannot block (memory) at once, and hands the
//! others (files, devices: a `fdatasync` can take milliseconds) to a small pool of
//! storage threads, whose completions come back through the reactor's wake-up eventfd.
//!
//! What a host can make the target hold is bounded: connections (over the limit they
//! are accepted and closed at once, so the host hears no rather than timing out),
//! connection setup time, commands per queue (SQSIZE + 1), and data per queue (the
//! queue budget, `proto::target::storage`). Accept errors (such as running out of file
//! descriptors) back off instead of spinning, and what peers can trigger is logged at
//! most once a second.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::proto::target::{CloseReason, QueueStats, StorageOp, StorageRequest, Subsystem, TargetQueue};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

use crate::wire::{Batch, RxBuf, send};
use netlane::metrics::cpu::{CpuTime, thread_cpu};
use netlane::metrics::prom::{Handler, MetricsServer, TEXT_FORMAT, check_metrics_addr};
use netlane::metrics::units;
use netlane::ratelimit::RateLimit;
use netlane::serve::{AcceptBackoff, Stop};
use netlane::time::monotonic_ns;

pub mod metrics;

/// The subsystem NQN `netlane nvme target` serves unless told otherwise.
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.netlane:target";

/// How the target runs.
#[derive(Debug, Clone)]
pub struct TargetOptions {
    /// Addresses to listen on (default port 4420); each is a port of the subsystem (two
    /// give a host two paths, for multipath).
    pub listen: Vec<SocketAddr>,
    /// One reactor per CPU in this list.
    pub cpus: Vec<usize>,
    /// Spin on the sockets instead of sleeping; with `Some(us)` also set `SO_BUSY_POLL`.
    pub busy_poll: Option<u32>,
    /// Spin (zero-timeout epoll) even without `SO_BUSY_POLL`.
    pub spin: bool,
    /// Most connections served at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// Most connections from one source address that have not finished ICReq and
    /// Connect; more from it are closed as soon as accepted, so one source cannot hold
    /// every slot with connections that never finish setting up.
    pub max_setup_per_source: usize,
    /// Threads that run storage operations which may block (file namespaces).
    pub storage_threads: usize,
    /// Serve Prometheus metrics on this (loopback) address: `GET /metrics`.
    pub metrics_addr: Option<SocketAddr>,
}

/// Connections in setup one source address may have by default: a host connects its
/// queues one after another, so even a host with many queues has few in setup at once.
pub const DEFAULT_SETUP_PER_SOURCE: usize = 64;

impl TargetOptions {
    /// Listening on `listen`, one reactor on CPU 0, 1024 connections (64 of one source
    /// in setup), 4 storage threads.
    pub fn new(listen: SocketAddr) -> TargetOptions {
        TargetOptions {
            listen: vec![listen],
            cpus: vec![0],
            busy_poll: None,
            spin: false,
            max_connections: 1024,
            max_setup_per_source: DEFAULT_SETUP_PER_SOURCE,
            storage_threads: 4,
            metrics_addr: None,
        }
    }

    /// Checks what a user can get wrong.
    pub fn validate(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.listen.is_empty() {
            return bad("`listen`: the target needs at least one address to listen on".into());
        }
        if self.cpus.is_empty() {
            return bad("`cpus`: the target needs at least one reactor CPU".into());
        }
        if !(1..=1 << 20).contains(&self.max_connections) {
            return bad(format!("`max_connections` {}: must be 1..=1048576", self.max_connections));
        }
        if self.max_setup_per_source == 0 {
            return bad("`max_setup_per_source` must be at least 1".into());
        }
        if !(1..=256).contains(&self.storage_threads) {
            return bad(format!("`storage_threads` {}: must be 1..=256", self.storage_threads));
        }
        if let Some(a) = self.metrics_addr {
            check_metrics_addr(a).or_else(|e| bad(format!("`metrics_addr` {a}: {e}")))?;
        }
        Ok(())
    }
}

/// Counters of a running or stopped target.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct TargetStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections closed at once because the limit was reached.
    pub refused: u64,
    /// Connections closed at once because their source already had the most
    /// connections in setup it may have.
    pub refused_in_setup: u64,
    /// Failed accept() calls (e.g. out of file descriptors).
    pub accept_errors: u64,
    /// Connections closed, by reason.
    pub closed: BTreeMap<String, u64>,
    /// Commands received.
    pub commands: u64,
    /// Failed completions by status (`0xSCT_SC`, e.g. `0x0002` for Invalid Field).
    pub errors: BTreeMap<String, u64>,
    /// Storage operations run on the reactors (namespaces that do not block).
    pub storage_inline: u64,
    /// Storage operations run on the storage threads.
    pub storage_offloaded: u64,
    /// Reactor rounds.
    pub rounds: u64,
    /// send() calls.
    pub sends: u64,
    /// CPU time of the reactor threads.
    pub reactor_cpu: CpuTime,
    /// The subsystem's counters (what the SMART log reports).
    pub subsystem: SubsystemCounters,
}

/// A snapshot of the subsystem's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SubsystemCounters {
    /// Read commands completed.
    pub read_cmds: u64,
    /// Write commands completed.
    pub write_cmds: u64,
    /// Flush commands accepted.
    pub flush_cmds: u64,
    /// 512-byte units read.
    pub sectors_read: u64,
    /// 512-byte units written.
    pub sectors_written: u64,
    /// Connections terminated for a protocol violation.
    pub terminations: u64,
    /// Data digest errors seen.
    pub data_digest_errors: u64,
    /// Controllers removed because their keep-alive timer expired.
    pub keepalive_expiries: u64,
    /// Storage operations that failed (each failed its command).
    pub storage_failures: u64,
}

impl SubsystemCounters {
    fn of(s: &Subsystem) -> SubsystemCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let st = &s.stats;
        SubsystemCounters {
            read_cmds: g(&st.read_cmds),
            write_cmds: g(&st.write_cmds),
            flush_cmds: g(&st.flush_cmds),
            sectors_read: g(&st.sectors_read),
            sectors_written: g(&st.sectors_written),
            terminations: g(&st.terminations),
            data_digest_errors: g(&st.data_digest_errors),
            keepalive_expiries: g(&st.keepalive_expiries),
            storage_failures: g(&st.storage_failures),
        }
    }
}

/// One live queue, as the metrics see it.
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    /// The host's address.
    pub peer: SocketAddr,
    /// Controller, once connected.
    pub cntlid: Option<u16>,
    /// Queue ID, once connected.
    pub qid: Option<u16>,
    /// Its counters.
    pub stats: QueueStats,
}

/// Per-queue counters: the live queues (refreshed by the reactors twice a second) and
/// the sum over the queues that have closed.
#[derive(Debug, Clone, Default)]
pub struct QueueMetricsSnapshot {
    /// Live queues by connection number.
    pub live: BTreeMap<u64, QueueMetrics>,
    /// Sum over closed queues.
    pub closed: QueueStats,
}

#[derive(Debug)]
struct Shared {
    /// Given when the target stops: every reactor and the acceptor wait on it.
    stop: Stop,
    connections: AtomicU64,
    live: AtomicU64,
    refused: AtomicU64,
    refused_in_setup: AtomicU64,
    /// Connections in setup (no ICReq and Connect yet), by source address.
    in_setup: Mutex<HashMap<std::net::IpAddr, usize>>,
    accept_errors: AtomicU64,
    stats: Mutex<TargetStats>,
    queues: Mutex<QueueMetricsSnapshot>,
}

/// A running target; [`TargetServer::stop`] (or drop) ends it.
#[derive(Debug)]
pub struct TargetServer {
    addrs: Vec<SocketAddr>,
    subsys: Arc<Subsystem>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    wakers: Vec<Arc<EventFd>>,
    pool: Option<mpsc::Sender<PoolJob>>,
    workers: Vec<JoinHandle<()>>,
    metrics: Option<MetricsServer>,
}

/// A storage request for the pool, and where its result goes.
struct PoolJob {
    token: u64,
    req: StorageRequest,
    reply: mpsc::Sender<Done>,
    wake: Arc<EventFd>,
}

/// A storage request's result, back at its reactor.
struct Done {
    token: u64,
    tag: u32,
    read: bool,
    result: io::Result<Option<Vec<u8>>>,
}

/// A new connection for a reactor.
struct NewConn {
    sock: TcpStream,
    peer: SocketAddr,
    id: u64,
}

struct Reactor {
    cpu: usize,
    rx: mpsc::Receiver<NewConn>,
    done_rx: mpsc::Receiver<Done>,
    done_tx: mpsc::Sender<Done>,
    pool: mpsc::Sender<PoolJob>,
    wake: Arc<EventFd>,
    subsys: Arc<Subsystem>,
    shared: Arc<Shared>,
    busy_poll: Option<u32>,
    spin: bool,
}

struct Conn {
    sock: TcpStream,
    peer: SocketAddr,
    rx: RxBuf,
    q: TargetQueue,
    interest: EpollFlags,
    /// Storage requests out on the pool.
    offloaded: u32,
    /// Counted among its source's connections in setup (no controller yet).
    setting_up: bool,
}

/// Output backlog above which a connection stops being read until it drains.
const BACKLOG_LIMIT: usize = 8 << 20;
/// Output size at which a round sends early (with `MSG_MORE`) rather than buffer more.
const FLUSH_AT: usize = 256 << 10;
const WAKE_TOKEN: u64 = u64::MAX;
/// The stop signal's token in a reactor's epoll set.
const STOP_TOKEN: u64 = u64::MAX - 1;
/// Bytes read from one connection per reactor round before moving on to the next.
const READ_BUDGET: usize = 256 << 10;
/// How often reactors publish their queues' counters for the metrics.
const PUBLISH_EVERY_NS: u64 = 500_000_000;
/// Peer-triggered log lines: at most one per this.
const LOG_EVERY: Duration = Duration::from_secs(1);

impl TargetServer {
    /// Binds every address, starts the reactors, the storage threads and the acceptor.
    /// Fails first, before taking anything, when the namespaces and every connection's
    /// queue budget could take more memory than the machine has.
    pub fn start(subsys: Arc<Subsystem>, opts: &TargetOptions) -> io::Result<TargetServer> {
        opts.validate()?;
        let budget = subsys.config.queue_budget;
        let mut ask = netlane::memory::Ask::new();
        for (i, ns) in subsys.namespaces().iter().enumerate() {
            ask = ask.add(format!("namespace {}", i + 1), ns.memory());
        }
        ask.add(
            format!("{} connections x a {} queue budget", opts.max_connections, units::format_size(budget.into())),
            opts.max_connections as u64 * u64::from(budget),
        )
        .check()
        .map_err(io::Error::other)?;
        let mut listeners = Vec::new();
        for a in &opts.listen {
            let l = TcpListener::bind(a).map_err(|e| io::Error::new(e.kind(), format!("listen on {a}: {e}")))?;
            l.set_nonblocking(true)?;
            listeners.push(l);
        }
        let addrs = listeners.iter().map(|l| l.local_addr()).collect::<io::Result<Vec<_>>>()?;
        subsys.set_listening(&addrs);
        let shared = Arc::new(Shared::new()?);
        let metrics = match opts.metrics_addr {
            Some(a) => {
                let (shared, subsys) = (shared.clone(), subsys.clone());
                let handler: Arc<Handler> = Arc::new(move |path: &str| {
                    (path == "/metrics").then(|| {
                        let queues = shared.queues.lock().map(|q| q.clone()).unwrap_or_default();
                        (TEXT_FORMAT, metrics::render(&collect_stats(&shared, &subsys), &queues))
                    })
                });
                let m = MetricsServer::start(a, "nvmet-metrics", handler)
                    .map_err(|e| io::Error::new(e.kind(), format!("metrics on {a}: {e}")))?;
                Some(m)
            }
            None => None,
        };

        let (pool_tx, pool_rx) = mpsc::channel::<PoolJob>();
        let pool_rx = Arc::new(Mutex::new(pool_rx));
        let mut workers = Vec::new();
        for i in 0..opts.storage_threads {
            let (rx, subsys) = (pool_rx.clone(), subsys.clone());
            workers.push(
                std::thread::Builder::new().name(format!("nvmet-io{i}")).spawn(move || storage_worker(&rx, &subsys))?,
            );
        }

        let mut threads = Vec::new();
        let mut senders = Vec::new();
        let mut wakers = Vec::new();
        for &cpu in &opts.cpus {
            let (tx, rx) = mpsc::channel();
            let (done_tx, done_rx) = mpsc::channel();
            let wake = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?);
            let r = Reactor {
                cpu,
                rx,
                done_rx,
                done_tx,
                pool: pool_tx.clone(),
                wake: wake.clone(),
                subsys: subsys.clone(),
                shared: shared.clone(),
                busy_poll: opts.busy_poll,
                spin: opts.spin || opts.busy_poll.is_some(),
            };
            threads.push(std::thread::Builder::new().name(format!("nvmet-r{cpu}")).spawn(move || {
                if let Err(e) = r.run() {
                    tracing::error!("reactor on CPU {cpu} failed: {e}");
                }
            })?);
            senders.push((tx, wake.clone()));
            wakers.push(wake);
        }
        let (acc_shared, acc_subsys) = (shared.clone(), subsys.clone());
        let limits = (opts.max_connections as u64, opts.max_setup_per_source);
        threads.push(std::thread::Builder::new().name("nvmet-accept".into()).spawn(move || {
            accept_loop(listeners, senders, acc_shared, &acc_subsys, limits);
        })?);
        Ok(TargetServer { addrs, subsys, shared, threads, wakers, pool: Some(pool_tx), workers, metrics })
    }

    /// The (first) address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Every address it listens on.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The subsystem served.
    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.subsys
    }

    /// Whether a reactor or the acceptor has exited (on error).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().any(|t| t.is_finished())
    }

    /// Connections open now.
    pub fn live_connections(&self) -> u64 {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// Counters so far (reactor CPU is filled in when reactors exit).
    pub fn stats(&self) -> TargetStats {
        collect_stats(&self.shared, &self.subsys)
    }

    /// Where the Prometheus metrics are served, if they are.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// The per-queue counters, as last published.
    pub fn queue_metrics(&self) -> QueueMetricsSnapshot {
        self.shared.queues.lock().map(|q| q.clone()).unwrap_or_default()
    }

    /// Serves until `stop` is given (a signal handler gives it), `time` has passed, or a
    /// thread of the target failed; then stops every thread and returns the final
    /// counters. A failed thread is an error.
    pub fn serve(self, stop: &Stop, time: Option<Duration>) -> io::Result<TargetStats> {
        let start = Instant::now();
        // The wait ends at once on a stop; its slice bounds how late a failed thread
        // or the end of `time` is noticed.
        while !stop.wait(Duration::from_millis(50)) {
            if self.is_finished() {
                return Err(io::Error::other("a target thread stopped unexpectedly (see the log above)"));
            }
            if time.is_some_and(|t| start.elapsed() >= t) {
                break;
            }
        }
        Ok(self.stop())
    }

    /// Stops every thread, closes every connection, and returns the counters.
    pub fn stop(mut self) -> TargetStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        self.shared.stop.stop();
        for w in &self.wakers {
            let _ = w.write(1);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The reactors held the other senders; with this one gone the workers finish
        // what they have and exit.
        self.pool = None;
        for t in self.workers.drain(..) {
            let _ = t.join();
        }
        self.metrics = None;
    }
}

impl Drop for TargetServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn collect_stats(shared: &Shared, subsys: &Subsystem) -> TargetStats {
    let mut s = shared.stats.lock().map(|s| s.clone()).unwrap_or_default();
    s.connections = shared.connections.load(Ordering::Relaxed);
    s.refused = shared.refused.load(Ordering::Relaxed);
    s.refused_in_setup = shared.refused_in_setup.load(Ordering::Relaxed);
    s.accept_errors = shared.accept_errors.load(Ordering::Relaxed);
    s.subsystem = SubsystemCounters::of(subsys);
    if let Ok(q) = shared.queues.lock() {
        let mut all = q.closed.clone();
        for m in q.live.values() {
            merge_queue_stats(&mut all, &m.stats);
        }
        s.commands = all.commands;
        s.errors = all.errors.iter().map(|(k, v)| (format!("{k:#06x}"), *v)).collect();
    }
    s
}

/// Adds one queue's counters to a sum.
pub fn merge_queue_stats(sum: &mut QueueStats, q: &QueueStats) {
    sum.commands += q.commands;
    sum.responses += q.responses;
    sum.c2h_pdus += q.c2h_pdus;
    sum.r2ts += q.r2ts;
    sum.success_flag += q.success_flag;
    sum.reads += q.reads;
    sum.read_bytes += q.read_bytes;
    sum.writes += q.writes;
    sum.write_bytes += q.write_bytes;
    for (k, v) in &q.errors {
        *sum.errors.entry(*k).or_default() += v;
    }
    sum.latency.merge(&q.latency);
}

fn storage_worker(rx: &Mutex<mpsc::Receiver<PoolJob>>, subsys: &Subsystem) {
    loop {
        let job = match rx.lock() {
            Ok(g) => match g.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let read = job.req.is_read();
        let result = match job.req.op {
            StorageOp::Read { len, .. } => {
                let mut buf = vec![0u8; len as usize];
                subsys.read_part(&job.req, 0, &mut buf).map(|()| Some(buf))
            }
            _ => subsys.perform(&job.req).map(|()| None),
        };
        if job.reply.send(Done { token: job.token, tag: job.req.tag, read, result }).is_ok() {
            let _ = job.wake.write(1);
        }
    }
}

impl Shared {
    fn new() -> io::Result<Shared> {
        Ok(Shared {
            stop: Stop::new()?,
            connections: AtomicU64::default(),
            live: AtomicU64::default(),
            refused: AtomicU64::default(),
            refused_in_setup: AtomicU64::default(),
            in_setup: Mutex::default(),
            accept_errors: AtomicU64::default(),
            stats: Mutex::default(),
            queues: Mutex::default(),
        })
    }

    /// Counts a connection from `ip` into setup: false, and nothing counted, when `ip`
    /// already has `limit` in setup.
    fn enter_setup(&self, ip: std::net::IpAddr, limit: usize) -> bool {
        let Ok(mut m) = self.in_setup.lock() else { return true };
        let n = m.entry(ip).or_default();
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    /// A connection from `ip` finished setting up, or closed before it did.
    fn leave_setup(&self, ip: std::net::IpAddr) {
        if let Ok(mut m) = self.in_setup.lock()
            && let Some(n) = m.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                m.remove(&ip);
            }
        }
    }
}

fn accept_loop(
    listeners: Vec<TcpListener>,
    reactors: Vec<(mpsc::Sender<NewConn>, Arc<EventFd>)>,
    shared: Arc<Shared>,
    subsys: &Subsystem,
    (max, per_source): (u64, usize),
) {
    let mut next = 0usize;
    let mut backoff = AcceptBackoff::new();
    let mut refused_log = RateLimit::new(LOG_EVERY);
    let (mut storage_reported, mut storage_at) = (0u64, Instant::now());
    while !shared.stop.is_stopped() {
        // Storage failures (a full disk fails every write on every queue) are summarised
        // here once per interval, not logged one line per command.
        if storage_at.elapsed() >= LOG_EVERY {
            storage_at = Instant::now();
            let failed = subsys.stats.storage_failures.load(Ordering::Relaxed);
            if failed > storage_reported {
                let last = subsys.stats.last_storage_failure.lock().map(|l| l.clone()).unwrap_or_default();
                tracing::warn!(
                    failed = failed - storage_reported,
                    total = failed,
                    "storage operations failed; the last: {last}"
                );
                storage_reported = failed;
            }
        }
        if !backoff.poll_wait().is_zero() && shared.stop.wait(backoff.poll_wait()) {
            break;
        }
        // The stop signal last, beside the listeners: a stop wakes this wait at once.
        let mut fds: Vec<_> = listeners
            .iter()
            .map(|l| l.as_fd())
            .chain([shared.stop.as_fd()])
            .map(|fd| nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN))
            .collect();
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u8)).unwrap_or(0) == 0 {
            continue;
        }
        let ready: Vec<bool> = fds[..listeners.len()].iter().map(|f| f.any().unwrap_or(false)).collect();
        for (l, _) in listeners.iter().zip(ready).filter(|(_, r)| *r) {
            match l.accept() {
                Ok((sock, peer)) => {
                    backoff.handle_accepted();
                    let id = shared.connections.fetch_add(1, Ordering::Relaxed);
                    if shared.live.load(Ordering::Acquire) >= max {
                        shared.refused.fetch_add(1, Ordering::Relaxed);
                        if let Some(n) = refused_log.allow(Instant::now()) {
                            tracing::warn!(%peer, limit = max, also_refused = n, "connection limit reached: closing a new connection");
                        }
                        drop(sock);
                        continue;
                    }
                    if !shared.enter_setup(peer.ip(), per_source) {
                        shared.refused_in_setup.fetch_add(1, Ordering::Relaxed);
                        if let Some(n) = refused_log.allow(Instant::now()) {
                            tracing::warn!(%peer, limit = per_source, also_refused = n, "too many connections in setup from this source: closing a new one");
                        }
                        drop(sock);
                        continue;
                    }
                    shared.live.fetch_add(1, Ordering::AcqRel);
                    tracing::info!(%peer, local = ?sock.local_addr().ok(), conn = id, "connection opened");
                    let (tx, wake) = &reactors[next % reactors.len()];
                    next += 1;
                    if tx.send(NewConn { sock, peer, id }).is_ok() {
                        let _ = wake.write(1);
                    } else {
                        shared.live.fetch_sub(1, Ordering::AcqRel);
                        shared.leave_setup(peer.ip());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors or memory: wait for connections to close rather
                    // than spin on a listener that stays readable.
                    shared.accept_errors.fetch_add(1, Ordering::Relaxed);
                    backoff.handle_error(&e, Instant::now());
                }
            }
        }
    }
}

fn reason_name(r: Option<&CloseReason>) -> String {
    match r {
        None => "peer closed".into(),
        Some(CloseReason::Violation(v)) => format!("violation: {}", v.fes),
        Some(CloseReason::PeerTerminated { .. }) => "host termination request".into(),
        Some(CloseReason::InvalidTermReq) => "invalid termination request".into(),
        Some(CloseReason::Disconnected) => "disconnect".into(),
        Some(CloseReason::KeepAliveExpired) => "keep-alive expired".into(),
        Some(CloseReason::ControllerGone) => "controller gone".into(),
        Some(CloseReason::SetupTimeout) => "setup timeout".into(),
    }
}

/// What a reactor counts, folded into the shared stats when it exits.
#[derive(Default)]
struct Tally {
    rounds: u64,
    sends: u64,
    inline: u64,
    offloaded: u64,
    closed: HashMap<String, u64>,
}

impl Reactor {
    fn run(self) -> io::Result<()> {
        netlane::cpus::pin(Some(self.cpu));
        let cpu0 = thread_cpu();
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        ep.add(self.wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN))?;
        ep.add(self.shared.stop.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, STOP_TOKEN))?;
        let mut conns: HashMap<u64, Conn> = HashMap::new();
        let mut events = vec![EpollEvent::empty(); 256];
        let mut touched: Vec<u64> = Vec::new();
        let mut last_timer = monotonic_ns();
        let mut last_publish = last_timer;
        let mut t = Tally::default();
        let mut violation_log = RateLimit::new(LOG_EVERY);
        while !self.shared.stop.is_stopped() {
            let timeout = if self.spin { 0u16 } else { 50 };
            let n = match ep.wait(&mut events, nix::poll::PollTimeout::from(timeout)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => return Err(e.into()),
            };
            t.rounds += 1;
            let now = monotonic_ns();
            touched.clear();
            for ev in &events[..n] {
                let token = ev.data();
                if token == WAKE_TOKEN {
                    let _ = self.wake.read();
                    while let Ok(nc) = self.rx.try_recv() {
                        let (id, peer_ip) = (nc.id, nc.peer.ip());
                        match self.register(&ep, nc, now) {
                            Ok(c) => {
                                conns.insert(id, c);
                                touched.push(id);
                            }
                            Err(e) => {
                                self.shared.live.fetch_sub(1, Ordering::AcqRel);
                                self.shared.leave_setup(peer_ip);
                                tracing::warn!("cannot serve a connection: {e}");
                            }
                        }
                    }
                    while let Ok(d) = self.done_rx.try_recv() {
                        let token = d.token;
                        if let Some(c) = conns.get_mut(&token) {
                            c.offloaded -= 1;
                            c.finish(d, monotonic_ns());
                            touched.push(token);
                        }
                    }
                    continue;
                }
                let Some(c) = conns.get_mut(&token) else { continue };
                touched.push(token);
                if ev.events().intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP)
                    && c.pump_input(now, &self, token, &mut t).is_err()
                {
                    c.q.handle_written(usize::MAX);
                    c.interest = EpollFlags::empty();
                }
            }
            // Timers: setup deadlines, keep-alive expiry, controllers that went away on
            // other reactors.
            if now.saturating_sub(last_timer) > 20_000_000 {
                last_timer = now;
                for (&id, c) in conns.iter_mut() {
                    if c.q.poll(now) {
                        touched.push(id);
                    }
                }
            }
            // Run what can run, send what the round produced; each connection's last
            // send of the round goes without MSG_MORE, so nothing stays corked.
            touched.sort_unstable();
            touched.dedup();
            for &id in &touched {
                let Some(c) = conns.get_mut(&id) else { continue };
                let ok = c.service(&self, id, &mut t).is_ok();
                if c.setting_up && c.q.cntlid().is_some() {
                    c.setting_up = false;
                    self.shared.leave_setup(c.peer.ip());
                }
                let done =
                    !ok || c.interest.is_empty() || (c.q.close_reason().is_some() && c.q.poll_output().is_empty());
                if done {
                    if let Some(c) = conns.remove(&id) {
                        let _ = ep.delete(c.sock.as_fd());
                        self.closed(id, c, &mut t, &mut violation_log);
                    }
                    continue;
                }
                let want = c.wanted_interest();
                if want != c.interest {
                    let mut ev = EpollEvent::new(want, id);
                    if ep.modify(c.sock.as_fd(), &mut ev).is_ok() {
                        c.interest = want;
                    }
                }
            }
            if now.saturating_sub(last_publish) > PUBLISH_EVERY_NS {
                last_publish = now;
                self.publish(&conns);
            }
        }
        for (id, c) in conns.drain() {
            self.fold(id, &c);
            self.shared.live.fetch_sub(1, Ordering::AcqRel);
            if c.setting_up {
                self.shared.leave_setup(c.peer.ip());
            }
            *t.closed.entry("target stopped".into()).or_default() += 1;
        }
        if let Ok(mut s) = self.shared.stats.lock() {
            s.rounds += t.rounds;
            s.sends += t.sends;
            s.storage_inline += t.inline;
            s.storage_offloaded += t.offloaded;
            for (k, v) in t.closed {
                *s.closed.entry(k).or_default() += v;
            }
            let used = thread_cpu() - cpu0;
            s.reactor_cpu.user_s += used.user_s;
            s.reactor_cpu.system_s += used.system_s;
            s.reactor_cpu.voluntary_switches += used.voluntary_switches;
            s.reactor_cpu.involuntary_switches += used.involuntary_switches;
        }
        Ok(())
    }

    /// A connection ends: counted, logged (violations rate-limited, at warn), its
    /// counters folded into the closed-queue sum.
    fn closed(&self, id: u64, c: Conn, t: &mut Tally, violation_log: &mut RateLimit) {
        let reason = reason_name(c.q.close_reason());
        *t.closed.entry(reason.clone()).or_default() += 1;
        self.shared.live.fetch_sub(1, Ordering::AcqRel);
        if c.setting_up {
            self.shared.leave_setup(c.peer.ip());
        }
        let (peer, cntlid, qid, commands) = (c.peer, c.q.cntlid(), c.q.qid(), c.q.stats.commands);
        match c.q.close_reason() {
            Some(CloseReason::Violation(v)) => {
                if let Some(n) = violation_log.allow(Instant::now()) {
                    tracing::warn!(%peer, conn = id, ?cntlid, also_terminated = n, "protocol violation: {}", v.reason);
                }
            }
            Some(CloseReason::SetupTimeout) => {
                if let Some(n) = violation_log.allow(Instant::now()) {
                    tracing::warn!(%peer, conn = id, also_closed = n, "closed: no ICReq and Connect within the setup timeout");
                }
            }
            _ => tracing::info!(%peer, conn = id, ?cntlid, ?qid, commands, %reason, "connection closed"),
        }
        self.fold(id, &c);
        let _ = c.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Moves a closed queue's counters from the live set to the closed sum.
    fn fold(&self, id: u64, c: &Conn) {
        if let Ok(mut q) = self.shared.queues.lock() {
            q.live.remove(&id);
            merge_queue_stats(&mut q.closed, &c.q.stats);
        }
    }

    /// Publishes this reactor's live queues' counters.
    fn publish(&self, conns: &HashMap<u64, Conn>) {
        if let Ok(mut q) = self.shared.queues.lock() {
            for (&id, c) in conns {
                q.live.insert(
                    id,
                    QueueMetrics { peer: c.peer, cntlid: c.q.cntlid(), qid: c.q.qid(), stats: c.q.stats.clone() },
                );
            }
        }
    }

    fn register(&self, ep: &Epoll, nc: NewConn, now: u64) -> io::Result<Conn> {
        let NewConn { sock, peer, id } = nc;
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        if let Some(us) = self.busy_poll
            && let Err(e) = netlane::sockopt::set_busy_poll(sock.as_fd(), us)
        {
            // Values above net.core.busy_read need CAP_NET_ADMIN; the reactor still
            // spins, only the in-kernel NAPI polling is lost.
            tracing::warn!("SO_BUSY_POLL {us} us refused ({e}); spinning without it");
        }
        let interest = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        ep.add(sock.as_fd(), EpollEvent::new(interest, id))?;
        let mut q = TargetQueue::new(self.subsys.clone(), now);
        if let Ok(local) = sock.local_addr() {
            q.set_local_addr(local);
        }
        Ok(Conn { sock, peer, rx: RxBuf::new(16 << 10), q, interest, offloaded: 0, setting_up: true })
    }
}

impl Conn {
    /// Reads until the socket is drained (or the output backlog is large), running the
    /// state machine and its storage requests on every read. Err means the connection
    /// is finished (EOF or error).
    fn pump_input(&mut self, now: u64, r: &Reactor, id: u64, t: &mut Tally) -> Result<(), ()> {
        // A fair share per round: a connection streaming megabytes of writes must not
        // starve the others of this reactor (head-of-line blocking across queues).
        let mut budget = READ_BUDGET;
        loop {
            if budget == 0 {
                return Ok(());
            }
            if self.q.close_reason().is_some() {
                return Ok(());
            }
            if self.q.poll_output().len() >= BACKLOG_LIMIT {
                return Ok(());
            }
            let need = self.q.needed(self.rx.data()).unwrap_or(0);
            match self.rx.read_from(&self.sock, need) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    let used = self.q.handle_input(self.rx.data(), now);
                    self.rx.consume(used);
                    self.dispatch(r, id, t);
                    if self.q.poll_output().len() >= FLUSH_AT {
                        self.flush(Batch::More, &mut t.sends).map_err(|_| ())?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
    }

    /// Starts the storage requests that may start: on the reactor for namespaces that
    /// do not block, on the pool otherwise.
    fn dispatch(&mut self, r: &Reactor, id: u64, t: &mut Tally) {
        let mut now = None;
        while let Some(req) = self.q.poll_storage() {
            if r.subsys.blocks(&req) {
                t.offloaded += 1;
                let job = PoolJob { token: id, req, reply: r.done_tx.clone(), wake: r.wake.clone() };
                match r.pool.send(job) {
                    Ok(()) => self.offloaded += 1,
                    // The pool is gone (stopping): run it here.
                    Err(mpsc::SendError(job)) => self.q.run_here(job.req, monotonic_ns()),
                }
            } else {
                t.inline += 1;
                let at = *now.get_or_insert_with(monotonic_ns);
                self.q.run_here(req, at);
            }
        }
    }

    /// Applies a storage result from the pool.
    fn finish(&mut self, d: Done, now: u64) {
        match d.result {
            Ok(Some(buf)) => self.q.complete_read(d.tag, now, |off, dst| {
                dst.copy_from_slice(&buf[off..off + dst.len()]);
                Ok(())
            }),
            Ok(None) => self.q.complete(d.tag, Ok(()), now),
            Err(e) if d.read => self.q.complete_read(d.tag, now, |_, _| Err(io::Error::new(e.kind(), e.to_string()))),
            Err(e) => self.q.complete(d.tag, Err(e), now),
        }
    }

    /// Sends the output, starting more storage work as sending makes room, until the
    /// socket is full or nothing is left.
    fn service(&mut self, r: &Reactor, id: u64, t: &mut Tally) -> io::Result<()> {
        loop {
            self.dispatch(r, id, t);
            let before = self.q.poll_output().len();
            self.flush(Batch::Last, &mut t.sends)?;
            let after = self.q.poll_output().len();
            // Stop when the socket took nothing, or when nothing waits for the room.
            if after == before || after > 0 || !self.q.storage_pending() {
                return Ok(());
            }
        }
    }

    fn flush(&mut self, batch: Batch, sends: &mut u64) -> io::Result<()> {
        // MSG_MORE corks the socket until a send without it (or 200 ms). A mid-round
        // send keeps its last byte back, so the round's final send always has data to
        // carry and uncorks everything before it.
        let keep = usize::from(batch == Batch::More);
        while self.q.poll_output().len() > keep {
            let out = self.q.poll_output();
            let n = send(&self.sock, &out[..out.len() - keep], batch)?;
            *sends += 1;
            if n == 0 {
                break;
            }
            self.q.handle_written(n);
        }
        Ok(())
    }

    fn wanted_interest(&self) -> EpollFlags {
        let backlog = self.q.poll_output().len();
        let mut f = EpollFlags::EPOLLRDHUP;
        if backlog < BACKLOG_LIMIT && self.q.close_reason().is_none() {
            f |= EpollFlags::EPOLLIN;
        }
        if backlog > 0 {
            f |= EpollFlags::EPOLLOUT;
        }
        f
    }
}
