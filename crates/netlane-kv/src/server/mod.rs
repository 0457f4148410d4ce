//! The cache server: one epoll worker per lane over the sans-IO [`proto`](crate::proto)
//! core and one shared [`Store`], and an acceptor thread (which also runs the store's
//! active expiry).
//!
//! - **Lanes**: a worker is a lane ([`netlane::lanes`]): it serves the connections whose
//!   packets arrive on the receive queues it owns. [`Steer`] says how a connection gets
//!   there: round robin (no alignment), the acceptor handing it over by
//!   `SO_INCOMING_NAPI_ID`, or an `SO_REUSEPORT` group of per-lane listeners whose BPF
//!   selector picks by NAPI id. Lanes can be added and removed while traffic flows
//!   ([`Server::add_lane`], [`Server::remove_lane`]): the connections whose queues change
//!   owner move to their new lane with everything they had buffered, and nothing is
//!   lost. With a busy-poll policy each lane's epoll polls its queues before it sleeps.
//! - **Per request**, a worker does one `read`, runs every complete command, and one
//!   `write` of all the replies (a read shorter than the buffer means the socket is
//!   drained, so no extra read to find `EAGAIN`).
//! - **UDP** (memcached's `-U`): one `SO_REUSEPORT` socket per lane on the same port
//!   (with [`Steer::Reuseport`], the same selector picks by NAPI id).
//! - **Bounds**: a connection limit (over it a client gets memcached's
//!   `ERROR Too many open connections` and is closed), an idle timeout, and the
//!   per-connection buffer bounds of [`Limits`](crate::proto::Limits).
//! - **Stop**: [`Server::stop`] wakes every thread, writes what each connection has
//!   pending (best effort, non-blocking), closes, and returns the final counters.
//!
//! Here: the [`Server`] handle (started, lanes added and removed, stopped) and the
//! lanes' mailboxes; `config.rs` what it is started with, `device.rs` the lanes at
//! start on a lane device, `bind.rs` its sockets and reuseport selectors, `accept.rs`
//! the acceptor, `worker/` one lane's loop, `lanes.rs` the steering and what each lane
//! did, `host.rs` what `stats` and `/metrics` report, `stream.rs` TCP and Unix streams.

mod accept;
mod bind;
mod config;
mod device;
mod host;
mod lanes;
mod stream;
mod worker;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use netlane::lanes::LaneId;
use netlane::serve::Stop;
use netlane::topology::NetnsHandle;
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::store::{ConfigError, Store};

use bind::{Sockets, bind_tcp, set_sysctl};
pub use config::{MAX_LANES, ServerConfig, UnixListen};
use device::StartLanes;
use host::Shared;
pub use host::{ServerStats, Settings};
pub use lanes::{KnobView, LaneView, LanesView, Steer};

/// Why a server did not start, or a lane could not change.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A bad configuration value.
    #[error("{0}")]
    Config(String),
    /// The store's limits cannot work.
    #[error(transparent)]
    Store(#[from] ConfigError),
    /// The store and the connections could take more memory than the machine has.
    #[error(transparent)]
    Memory(#[from] netlane::memory::MemoryError),
    /// The device lanes were asked on cannot carry them.
    #[error("`lane_device`")]
    LaneDevice(#[source] netlane::lanes::queues::LaneDeviceError),
    /// The device's NAPI or XPS knobs could not be set.
    #[error("`lane_device` {dev}: set its queues' knobs")]
    LaneKnobs {
        /// The device.
        dev: String,
        /// Why not.
        #[source]
        source: netlane::topology::TopologyError,
    },
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io(netlane::error::IoError::new(what, source))
}

/// What a lane's mailbox carries.
#[derive(Debug)]
pub(crate) enum Mail {
    /// A new connection placed on this lane; `napi_id` is where its packets arrive;
    /// `admitted` its place under the connection limit.
    Conn { stream: stream::Stream, napi_id: u32, admitted: netlane::serve::Admitted },
    /// A connection another lane gave up, with everything it had buffered.
    Moved(Box<worker::Moving>),
    /// Give every connection whose NAPI id another lane now owns to that lane.
    Rehome,
    /// Give every connection away, close the listener, and stop.
    Retire,
}

/// A lane's mailbox: connections and orders for it, and its wake-up.
#[derive(Debug)]
pub(crate) struct Mailbox {
    inbox: Mutex<Vec<Mail>>,
    wake: EventFd,
}

impl Mailbox {
    fn new() -> Result<Mailbox, ServerError> {
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| ServerError::Io(netlane::error::IoError::new("eventfd", e.into())))?;
        Ok(Mailbox { inbox: Mutex::new(Vec::new()), wake })
    }

    pub(crate) fn post(&self, m: Mail) {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner()).push(m);
        let _ = self.wake.write(1);
    }

    pub(crate) fn take(&self) -> Vec<Mail> {
        let _ = self.wake.read();
        std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    stop: Stop,
    /// Worker threads by lane; the acceptor's under `None`.
    threads: Mutex<Vec<(Option<LaneId>, JoinHandle<()>)>>,
    /// Lane changes, one at a time.
    changing: Mutex<()>,
    cfg: ServerConfig,
    /// The network namespace it was started in: lanes added later bind and run there.
    netns: NetnsHandle,
    tcp_addr: Option<SocketAddr>,
    udp_addr: Option<SocketAddr>,
    /// Sysctls set for the server's lifetime.
    _sysctls: Vec<netlane::installed::Sysctl>,
    /// Per-NAPI settings and XPS maps it changed, put back when the server is dropped.
    _device_changes: Vec<netlane::installed::Held>,
}

impl Server {
    /// Binds, builds the store and starts the threads.
    pub fn start(cfg: ServerConfig) -> Result<Server, ServerError> {
        cfg.validate()?;
        cfg.memory_ask().check()?;
        let store = Store::new(cfg.store)?;
        let max_lanes = cfg.max_lanes();
        let StartLanes { map, queue_cpus, mut knobs, device_changes } = StartLanes::new(&cfg)?;
        let reuseport = cfg.steer == Steer::Reuseport;
        let sockets = Sockets::bind(&cfg)?;
        let mut sysctls = Vec::new();
        if reuseport {
            // A listener that closes (a lane leaving) hands the handshakes queued on it to
            // another listener of the group instead of resetting them (Linux 5.14).
            let (knob, guard) = set_sysctl("/proc/sys/net/ipv4/tcp_migrate_req", "1");
            knobs.push(knob);
            sysctls.extend(guard);
        }
        let (steering, udp_steering) = sockets.selectors(&cfg, &map)?;
        let settings = cfg.settings(store.shard_count(), sockets.tcp_addr, sockets.udp_addr);
        let mut mailboxes = Vec::with_capacity(max_lanes);
        for _ in 0..max_lanes {
            mailboxes.push(Arc::new(Mailbox::new()?));
        }
        let lanes = lanes::Lanes::new(cfg.steer, map, max_lanes, steering, udp_steering);
        for k in knobs {
            lanes.knob(None, k);
        }
        let conn_memory = crate::proto::ConnMemory::new(cfg.conn_memory.unwrap_or(cfg.store.memory));
        let shared = Arc::new(Shared::new(store, settings, max_lanes, lanes, mailboxes, conn_memory));
        let stop = Stop::new().map_err(io_err("create the stop signal"))?;
        let server = Server {
            shared,
            stop,
            threads: Mutex::new(Vec::new()),
            changing: Mutex::new(()),
            cfg: cfg.clone(),
            netns: NetnsHandle::current().map_err(|e| ServerError::Config(e.to_string()))?,
            tcp_addr: sockets.tcp_addr,
            udp_addr: sockets.udp_addr,
            _sysctls: sysctls,
            _device_changes: device_changes,
        };
        let Sockets { listeners, unix, udp, .. } = sockets;
        let mut listeners = listeners.into_iter();
        let first_listener = match unix {
            Some(u) => Some(stream::Listener::Unix(u)),
            None if reuseport => None,
            None => listeners.next().map(stream::Listener::Tcp),
        };
        server.spawn_lanes(udp, listeners, &queue_cpus)?;
        server.spawn_acceptor(first_listener)?;
        Ok(server)
    }

    /// Starts the workers of the lanes at start, each with the next UDP socket and TCP
    /// listener if any are left, pinned to its CPU of `cpus` or else to its first
    /// queue's.
    fn spawn_lanes(
        &self,
        udp: Vec<UdpSocket>,
        mut listeners: impl Iterator<Item = TcpListener>,
        queue_cpus: &BTreeMap<LaneId, usize>,
    ) -> Result<(), ServerError> {
        let mut udp = udp.into_iter();
        for lane in 0..self.cfg.threads {
            let cpu = match &self.cfg.cpus {
                Some(c) if !c.is_empty() => Some(c[lane % c.len()]),
                _ => queue_cpus.get(&lane).copied(),
            };
            self.spawn_lane(lane, cpu, udp.next(), listeners.next())?;
        }
        Ok(())
    }

    /// Starts the acceptor thread on `listener` (it also runs the store's active expiry).
    fn spawn_acceptor(&self, listener: Option<stream::Listener>) -> Result<(), ServerError> {
        let acc =
            accept::Acceptor::new(listener, self.shared.clone(), self.stop.clone()).map_err(io_err("acceptor"))?;
        self.threads.lock().unwrap_or_else(|p| p.into_inner()).push((
            None,
            std::thread::Builder::new()
                .name("kv-accept".into())
                .spawn(move || acc.run())
                .map_err(io_err("spawn acceptor"))?,
        ));
        Ok(())
    }

    fn spawn_lane(
        &self,
        lane: LaneId,
        cpu: Option<usize>,
        udp: Option<UdpSocket>,
        listener: Option<TcpListener>,
    ) -> Result<(), ServerError> {
        let w = worker::Worker::new(
            lane,
            self.shared.clone(),
            self.stop.clone(),
            self.cfg.limits,
            self.cfg.idle_timeout,
            udp,
            listener,
            self.cfg.busy_poll,
        )
        .map_err(io_err(format!("lane {lane}")))?;
        if let Some(c) = cpu {
            self.shared.lanes.cpus.lock().unwrap_or_else(|p| p.into_inner()).insert(lane, c);
        }
        // Started from a thread in the server's namespace, whichever thread asks.
        let t = self
            .netns
            .run(move || {
                std::thread::Builder::new().name(format!("kv-worker-{lane}")).spawn(move || {
                    netlane::cpus::pin(cpu);
                    w.run();
                })
            })
            .map_err(|e| ServerError::Config(e.to_string()))?
            .map_err(io_err("spawn worker"))?;
        self.threads.lock().unwrap_or_else(|p| p.into_inner()).push((Some(lane), t));
        Ok(())
    }

    /// Adds a lane while the server runs: it takes NAPI ids from the lanes owning the
    /// most (their connections move to it, with their buffered input and output) and,
    /// with [`Steer::Reuseport`], a listener of its own in the group. Returns its id.
    pub fn add_lane(&self, cpu: Option<usize>) -> Result<LaneId, ServerError> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        if self.stop.is_stopped() {
            return Err(ServerError::Config("the server is stopping".into()));
        }
        let lanes = &self.shared.lanes;
        // The worker first, then the lane in the map: no connection can be placed on
        // a lane whose worker does not run. (Lane changes are serialized: the number is
        // the one the map gives next.)
        let lane = lanes.map().next_lane_id();
        if lane >= self.shared.lane_slots() {
            return Err(ServerError::Config(format!(
                "no room for another lane: the server was started for {} lanes over its life (`max_lanes`)",
                self.shared.lane_slots()
            )));
        }
        let listener = if lanes.steer == Steer::Reuseport
            && let Some(addr) = self.tcp_addr
        {
            let backlog = self.cfg.backlog;
            Some(
                self.netns
                    .run(move || bind_tcp(addr, backlog, true))
                    .map_err(|e| ServerError::Config(e.to_string()))??,
            )
        } else {
            None
        };
        self.spawn_lane(lane, cpu, None, listener)?;
        let (added, moves) = match lanes.map().add_lane() {
            Ok(r) => r,
            Err(e) => {
                // Not in the map: it gives away whatever its listener took, and stops.
                self.shared.mailbox(lane).post(Mail::Retire);
                self.join_lane(lane);
                return Err(ServerError::Config(e.to_string()));
            }
        };
        debug_assert_eq!(added, lane);
        // Its listener joined the TCP group last (a lane added live has no UDP socket).
        lanes.joined_tcp(lane);
        // The lanes that gave up ids hand their connections over.
        let mut from: Vec<LaneId> = moves.iter().map(|m| m.from).collect();
        from.sort_unstable();
        from.dedup();
        for l in from {
            self.shared.mailbox(l).post(Mail::Rehome);
        }
        Ok(lane)
    }

    /// Removes a lane while the server runs: its NAPI ids go to the other lanes, and
    /// its connections move to their ids' new owners (connections without a NAPI id to
    /// the least loaded), with their buffered input and output; then its worker stops.
    /// The last lane cannot be removed.
    pub fn remove_lane(&self, lane: LaneId) -> Result<(), ServerError> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let lanes = &self.shared.lanes;
        lanes.map().remove_lane(lane).map_err(|e| ServerError::Config(e.to_string()))?;
        // New flows stop coming to its listener before it closes.
        lanes.resync();
        self.shared.mailbox(lane).post(Mail::Retire);
        self.join_lane(lane);
        // Connections posted to it after it retired go where the map puts them now.
        for m in self.shared.mailbox(lane).take() {
            let napi_id = match &m {
                Mail::Conn { napi_id, .. } => *napi_id,
                Mail::Moved(mv) => mv.napi_id(),
                Mail::Rehome | Mail::Retire => continue,
            };
            let mut map = lanes.map();
            let Some(t) = map.owner(napi_id).or_else(|| map.least_loaded(None)) else { continue };
            let _ = map.moved(lane, t);
            self.shared.mailbox(t).post(m);
        }
        // Its sockets are closed: in each group the last socket took its index.
        lanes.left(lane);
        Ok(())
    }

    /// Waits for lane `lane`'s worker to end.
    fn join_lane(&self, lane: LaneId) {
        let handle = {
            let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            threads.iter().position(|(l, _)| *l == Some(lane)).map(|i| threads.remove(i).1)
        };
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// The lanes now: what each owns and has done, and every knob applied or refused.
    pub fn lanes(&self) -> LanesView {
        self.shared.lanes.view()
    }

    /// The TCP address served.
    ///
    /// # Panics
    /// If the server serves no TCP ([`ServerConfig::tcp`] off): see [`Server::tcp_addr`].
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp_addr.expect("the server was started without TCP")
    }

    /// The TCP address served, if any.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The UDP address served, if any.
    pub fn udp_addr(&self) -> Option<SocketAddr> {
        self.udp_addr
    }

    /// What the server runs with.
    pub fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// The counters now.
    pub fn stats(&self) -> ServerStats {
        self.shared.snapshot()
    }

    /// A handle the metrics endpoint can render from.
    pub fn metrics_handler(&self) -> Arc<netlane::metrics::prom::Handler> {
        let shared = self.shared.clone();
        Arc::new(move |path: &str| {
            (path == "/metrics").then(|| (netlane::metrics::prom::TEXT_FORMAT, shared.prometheus()))
        })
    }

    /// Whether a client asked the server to shut down (`shutdown`, allowed by
    /// [`crate::proto::Settings`]), and if so whether gracefully.
    pub fn shutdown_requested(&self) -> Option<bool> {
        self.shared.shutdown_requested()
    }

    /// Whether a thread has ended without being asked to (it only does on a fatal error).
    pub fn failed(&self) -> bool {
        self.threads.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|(_, t)| t.is_finished())
    }

    /// Stops every thread, closes every connection, and returns the final counters.
    pub fn stop(mut self) -> ServerStats {
        self.shutdown();
        self.shared.snapshot()
    }

    fn shutdown(&mut self) {
        // Every worker and the acceptor wait on it: they wake at once.
        self.stop.stop();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for (_, t) in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Run under [`netlane::serve::supervise`]: it ends by itself when a thread failed or
/// a client asked for a shutdown.
impl netlane::serve::Running for Server {
    type Final = ServerStats;

    fn poll_ended(&self) -> Option<netlane::serve::Ended> {
        use netlane::serve::Ended;
        if self.failed() {
            return Some(Ended::Failed("a server thread stopped unexpectedly (see the log above)".into()));
        }
        self.shutdown_requested().map(|_| Ended::Asked("shutdown: asked for by a client".into()))
    }

    fn stop(self) -> ServerStats {
        Server::stop(self)
    }
}
