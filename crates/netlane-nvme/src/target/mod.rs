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
//!
//! Files: `accept.rs` the acceptor, `reactor.rs` the reactors, their connections and the
//! storage pool, `metrics.rs` the Prometheus exposition; this file the options, the
//! counters and the running target.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netlane::metrics::cpu::{CpuTime, thread_cpu};
use netlane::metrics::prom::{Handler, MetricsServer, TEXT_FORMAT, check_metrics_addr};
use netlane::metrics::units;
use netlane::ratelimit::RateLimit;
use netlane::serve::{AcceptBackoff, Admitted, ConnLimit, Ended, Outcome, Running, Stop};
use netlane::time::monotonic_ns;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

pub use crate::proto::target::SubsystemCounters;
use crate::proto::target::{CloseReason, QueueStats, StorageOp, StorageRequest, Subsystem, TargetQueue};
use crate::wire::{Batch, RxBuf, send};

mod accept;
pub mod metrics;
mod reactor;

use self::accept::accept_loop;
use self::reactor::{NewConn, PoolJob, Reactor, storage_worker};

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
    /// Lanes: place each connection on the reactor owning the receive queue it arrives
    /// on, by its NAPI id (the device's queues are dealt to the reactors in order, queue
    /// k to reactor k mod the reactors), so a queue's connections, its packets' NAPI
    /// work and their commands share one reactor's CPU. Connections that arrive through
    /// no NAPI instance are dealt in turn. `None`: every connection in turn.
    pub lane_device: Option<String>,
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
            lane_device: None,
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
    /// Where connections were placed, with lanes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lanes: Option<TargetLanes>,
}

/// How a target on lanes placed its connections.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct TargetLanes {
    /// The lane device.
    pub device: String,
    /// Each reactor: its CPU, the NAPI ids it owns, the connections placed on it.
    pub reactors: Vec<ReactorLane>,
    /// Connections placed on the reactor owning their NAPI id.
    pub by_owner: u64,
    /// Connections whose NAPI id the device did not list at start (now owned).
    pub new_ids: u64,
    /// Connections that arrived through no NAPI instance (dealt in turn).
    pub no_napi: u64,
}

/// One reactor's lane.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ReactorLane {
    /// The reactor's CPU.
    pub cpu: usize,
    /// The NAPI ids (receive queues) it owns.
    pub napi_ids: Vec<u32>,
    /// Connections placed on it.
    pub connections: u64,
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
    /// The connection limit: every open connection holds a place.
    limit: ConnLimit,
    refused_in_setup: AtomicU64,
    /// Connections in setup (no ICReq and Connect yet), by source address.
    in_setup: Mutex<HashMap<std::net::IpAddr, usize>>,
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
        let shared = Arc::new(Shared::new(opts.max_connections as u64)?);
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

        // Before any thread starts: a lane device that cannot be read fails the start.
        let lanes = match &opts.lane_device {
            Some(dev) => Some(accept::Lanes::new(dev, &opts.cpus)?),
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
            accept_loop(listeners, senders, acc_shared, &acc_subsys, limits, lanes);
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
        self.shared.limit.open()
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
        self.serve_ticking(stop, time, None, |_, _| {})
    }

    /// [`TargetServer::serve`], calling `tick` with the target and the time since it
    /// started every `every` (when given): a periodic line of its rates.
    pub fn serve_ticking(
        self,
        stop: &Stop,
        time: Option<Duration>,
        every: Option<Duration>,
        tick: impl FnMut(&TargetServer, Duration),
    ) -> io::Result<TargetStats> {
        match netlane::serve::supervise_ticking(self, stop, time, every, tick) {
            (Outcome::Ended(Ended::Failed(why)), _) => Err(io::Error::other(why)),
            (_, stats) => Ok(stats),
        }
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
    let admissions = shared.limit.counts();
    s.connections = admissions.admitted + admissions.refused;
    s.refused = admissions.refused;
    s.refused_in_setup = shared.refused_in_setup.load(Ordering::Relaxed);
    s.accept_errors = admissions.accept_errors;
    s.subsystem = subsys.stats.counts.load();
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

impl Shared {
    fn new(max_connections: u64) -> io::Result<Shared> {
        Ok(Shared {
            stop: Stop::new()?,
            limit: ConnLimit::new(max_connections),
            refused_in_setup: AtomicU64::default(),
            in_setup: Mutex::default(),
            stats: Mutex::default(),
            queues: Mutex::default(),
        })
    }

    /// Counts a connection from `ip` into setup until the returned token drops: `None`,
    /// and nothing counted, when `ip` already has `limit` in setup.
    fn enter_setup(self: &Arc<Self>, ip: std::net::IpAddr, limit: usize) -> Option<InSetup> {
        if let Ok(mut m) = self.in_setup.lock() {
            let n = m.entry(ip).or_default();
            if *n >= limit {
                return None;
            }
            *n += 1;
        }
        Some(InSetup { shared: Arc::clone(self), ip })
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

/// A connection counted among its source's connections in setup (no controller yet):
/// dropped when it has a controller, or with the connection.
#[derive(Debug)]
struct InSetup {
    shared: Arc<Shared>,
    ip: std::net::IpAddr,
}

impl Drop for InSetup {
    fn drop(&mut self) {
        self.shared.leave_setup(self.ip);
    }
}

/// Run under [`netlane::serve::supervise`]: it ends by itself only when a thread failed.
impl Running for TargetServer {
    type Final = TargetStats;

    fn poll_ended(&self) -> Option<Ended> {
        self.is_finished().then(|| Ended::Failed("a target thread stopped unexpectedly (see the log above)".into()))
    }

    fn stop(self) -> TargetStats {
        TargetServer::stop(self)
    }
}
