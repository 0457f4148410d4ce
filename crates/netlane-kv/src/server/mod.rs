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
//!   per-connection buffer bounds of [`Limits`].
//! - **Stop**: [`Server::stop`] wakes every thread, writes what each connection has
//!   pending (best effort, non-blocking), closes, and returns the final counters.

mod accept;
mod host;
mod lanes;
mod stream;
mod worker;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use netlane::lanes::{BusyPoll, LaneId, LaneMap, ReuseportSteering};
use netlane::serve::Stop;
use netlane::topology::NetnsHandle;
use netlane::topology::netdev::NapiSettings;
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::proto::Limits;
use crate::store::{ConfigError, Store, StoreConfig};

use host::Shared;
pub use host::{ServerStats, Settings};
pub use lanes::{KnobView, LaneView, LanesView, Steer};

/// A Unix stream socket to serve (memcached's `-s` and `-a`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixListen {
    /// The socket file.
    pub path: std::path::PathBuf,
    /// Its access mode (memcached's default 0700).
    pub mask: u32,
}

/// What a server is started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The address to serve, and the TCP port (0 picks one).
    pub listen: SocketAddr,
    /// Serve TCP on `listen` (memcached's `-p 0` turns it off).
    pub tcp: bool,
    /// Also serve UDP on this port of the listen address (0 picks one).
    pub udp_port: Option<u16>,
    /// Also serve a Unix stream socket.
    pub unix: Option<UnixListen>,
    /// Worker threads: the lanes at start.
    pub threads: usize,
    /// The store's limits.
    pub store: StoreConfig,
    /// Per-connection bounds.
    pub limits: Limits,
    /// Most simultaneous connections (memcached's `-c`).
    pub max_conns: usize,
    /// Close connections idle this long (memcached's `idle_timeout`; `None`: never).
    pub idle_timeout: Option<Duration>,
    /// CPUs to pin workers to, in order (wrapping); `None`: not pinned (or pinned to
    /// their queues' CPUs, see `lane_device`).
    pub cpus: Option<Vec<usize>>,
    /// The listen backlog.
    pub backlog: i32,
    /// How a new connection finds its lane.
    pub steer: Steer,
    /// Busy polling on each lane's epoll instance and sockets.
    pub busy_poll: Option<BusyPoll>,
    /// The interface whose receive queues the lanes own: its NAPI ids are dealt out in
    /// queue order at start, and without `cpus` each lane is pinned to the CPU of the
    /// first queue it owns. `None`: ids are learned from connections as they come.
    pub lane_device: Option<String>,
    /// Per-NAPI settings written to that interface's queues at start.
    pub napi: NapiSettings,
    /// Transmit alignment on that interface: transmit queue i paired with receive
    /// queue i (`xps_rxqs`).
    pub xps_rxqs: bool,
    /// Most lanes the server may ever start, live additions included (`None`: the
    /// starting count, so lanes can be removed but not added).
    pub max_lanes: Option<usize>,
    /// What clients may do (memcached's `-A`, `-F`, `-X`, `-B`, memcached-debug's
    /// `debugtime`).
    pub proto: crate::proto::Settings,
    /// Memory all connections may hold beyond their base buffers, for values being
    /// received and replies waiting to be sent (memcached's `read_buf_mem_limit`);
    /// `None`: as much as the store's memory limit.
    pub conn_memory: Option<u64>,
}

impl ServerConfig {
    /// The memory the server may take at its limits: the store's, and what connections
    /// may hold for values and replies.
    pub fn memory_ask(&self) -> netlane::memory::Ask {
        netlane::memory::Ask::new()
            .add("the cache", self.store.memory)
            .add("values and replies in flight", self.conn_memory.unwrap_or(self.store.memory))
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 11211)),
            tcp: true,
            udp_port: None,
            unix: None,
            threads: 4,
            store: StoreConfig::default(),
            limits: Limits::default(),
            max_conns: 1024,
            idle_timeout: None,
            cpus: None,
            backlog: 1024,
            steer: Steer::RoundRobin,
            busy_poll: None,
            lane_device: None,
            napi: NapiSettings::default(),
            xps_rxqs: false,
            max_lanes: None,
            proto: crate::proto::Settings::default(),
            conn_memory: None,
        }
    }
}

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

/// The most lanes a server may start over its life.
pub const MAX_LANES: usize = 256;

impl ServerConfig {
    /// Checks the values before anything is bound.
    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |m: String| Err(ServerError::Config(m));
        if !(1..=MAX_LANES).contains(&self.threads) {
            return bad(format!("`threads` {}: must be 1..={MAX_LANES}", self.threads));
        }
        if let Some(m) = self.max_lanes
            && !(self.threads..=MAX_LANES).contains(&m)
        {
            return bad(format!(
                "`max_lanes` {m}: must be at least the lanes at start ({}) and at most {MAX_LANES}",
                self.threads
            ));
        }
        if !(1..=1_000_000).contains(&self.max_conns) {
            return bad(format!("`max_conns` {}: must be 1..=1000000", self.max_conns));
        }
        if self.idle_timeout.is_some_and(|d| d < Duration::from_secs(1)) {
            return bad("`idle_timeout` must be at least 1s".into());
        }
        let l = &self.limits;
        if !(256..=1 << 20).contains(&l.max_line) {
            return bad(format!("line limit {} bytes: must be 256 B..=1 MiB", l.max_line));
        }
        if l.commands_per_turn == 0 || l.read_chunk < 1024 || l.output_pause < 4096 {
            return bad("connection limits: commands per turn >= 1, read chunk >= 1 KiB, output pause >= 4 KiB".into());
        }
        if !self.tcp && self.steer == Steer::Reuseport {
            return bad("reuseport steering needs TCP".into());
        }
        if let Some(c) = &self.cpus {
            netlane::cpus::CpuList::new(c.clone()).check_online().map_err(|e| ServerError::Config(e.to_string()))?;
        }
        if (!self.napi.is_empty() || self.xps_rxqs) && self.lane_device.is_none() {
            return bad("NAPI settings and `xps_rxqs` need the device whose queues they are for (`lane_device`)".into());
        }
        Ok(())
    }

    fn max_lanes(&self) -> usize {
        self.max_lanes.unwrap_or(self.threads)
    }
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
        // The lane map: the device's queues dealt out in order, if there is a device.
        let mut map = LaneMap::new(cfg.threads).map_err(|e| ServerError::Config(e.to_string()))?;
        let mut queue_cpus = std::collections::BTreeMap::new();
        let mut start_knobs = Vec::new();
        let mut sysctls = Vec::new();
        let mut device_changes = Vec::new();
        if let Some(dev) = &cfg.lane_device {
            let q = netlane::lanes::queues::lane_device(dev).map_err(ServerError::LaneDevice)?;
            let ifindex = q.ifindex;
            map.learn(&q.napi_ids());
            for rq in &q.rx {
                if let (Some(lane), Some(cpu)) = (map.owner(rq.napi_id), rq.cpu) {
                    queue_cpus.entry(lane).or_insert(cpu);
                }
            }
            // The sysfs fallbacks and XPS need the namespace's own /sys (and root).
            let here = NetnsHandle::current().map_err(|e| ServerError::Config(e.to_string()))?;
            let wanted = !cfg.napi.is_empty() || cfg.xps_rxqs;
            let (napi, xps, rx_count) = (cfg.napi, cfg.xps_rxqs, q.rx.len() + q.rx_without_napi.len());
            let ids = q.napi_ids();
            let dev2 = dev.clone();
            start_knobs = if !wanted {
                Vec::new()
            } else {
                let applied = here
                    .with_sysfs(move || {
                        let mut a = netlane::lanes::queues::apply_napi_settings(&dev2, ifindex, &ids, &napi);
                        if xps {
                            a.extend(netlane::lanes::queues::apply_xps_rxqs(&dev2, rx_count));
                        }
                        a
                    })
                    .map_err(|source| ServerError::LaneKnobs { dev: dev.clone(), source })?;
                device_changes = applied.held;
                applied.knobs
            };
        }
        let reuseport = cfg.steer == Steer::Reuseport;
        // TCP: one listener, or one per lane in a reuseport group (in lane order).
        let mut listeners: Vec<TcpListener> = Vec::new();
        let mut tcp_addr = None;
        if cfg.tcp {
            let first = bind_tcp(cfg.listen, cfg.backlog, reuseport)?;
            let addr = first.local_addr().map_err(io_err("local address"))?;
            listeners.push(first);
            if reuseport {
                for _ in 1..cfg.threads {
                    listeners.push(bind_tcp(addr, cfg.backlog, true)?);
                }
            }
            tcp_addr = Some(addr);
        }
        let unix = cfg
            .unix
            .as_ref()
            .map(|u| {
                stream::UnixSocket::bind(&u.path, u.mask, cfg.backlog)
                    .map_err(io_err(format!("bind Unix socket {}", u.path.display())))
            })
            .transpose()?;
        let udp = match cfg.udp_port {
            None => Vec::new(),
            Some(port) => bind_udp_group(SocketAddr::new(cfg.listen.ip(), port), cfg.threads)?,
        };
        let udp_addr = udp.first().map(|s| s.local_addr()).transpose().map_err(io_err("UDP local address"))?;
        if reuseport {
            // A listener that closes (a lane leaving) hands the handshakes queued on it to
            // another listener of the group instead of resetting them (Linux 5.14).
            let (knob, guard) = set_sysctl("/proc/sys/net/ipv4/tcp_migrate_req", "1");
            start_knobs.push(knob);
            sysctls.extend(guard);
        }
        let steering = if reuseport {
            let mut st = ReuseportSteering::load().map_err(io_err("load the reuseport selector (needs root)"))?;
            st.attach(listeners[0].as_fd()).map_err(io_err("attach the reuseport selector"))?;
            for lane in 0..cfg.threads {
                st.joined(lane);
            }
            st.sync(&map).map_err(io_err("write the reuseport selector's map"))?;
            Some(st)
        } else {
            None
        };
        // The UDP group gets a selector of its own (its sockets joined in lane order too).
        let udp_steering = if reuseport && !udp.is_empty() {
            let mut st = ReuseportSteering::load().map_err(io_err("load the UDP reuseport selector"))?;
            st.attach(udp[0].as_fd()).map_err(io_err("attach the UDP reuseport selector"))?;
            for lane in 0..cfg.threads {
                st.joined(lane);
            }
            st.sync(&map).map_err(io_err("write the UDP reuseport selector's map"))?;
            Some(st)
        } else {
            None
        };
        let settings = Settings {
            tcp_port: tcp_addr.map_or(0, |a| a.port()),
            udp_port: udp_addr.map_or(0, |a| a.port()),
            threads: cfg.threads,
            max_conns: cfg.max_conns,
            item_size_max: cfg.store.item_max,
            maxbytes: cfg.store.memory,
            idle_timeout_s: cfg.idle_timeout.map_or(0, |d| d.as_secs()),
            limits: cfg.limits,
            shards: store.shard_count(),
            proto: cfg.proto,
            unix_socket: cfg.unix.as_ref().map(|u| u.path.clone()),
            unix_mask: cfg.unix.as_ref().map_or(0o700, |u| u.mask),
            backlog: cfg.backlog,
            growth_factor: cfg.store.classes.map_or(1.25, |c| c.factor),
            chunk_size: cfg.store.classes.map_or(48, |c| c.min_size),
        };
        let mut mailboxes = Vec::with_capacity(max_lanes);
        for _ in 0..max_lanes {
            mailboxes.push(Arc::new(Mailbox::new()?));
        }
        let lanes = lanes::Lanes::new(cfg.steer, map, max_lanes, steering, udp_steering);
        for k in start_knobs {
            lanes.knob(None, k);
        }
        let conn_memory = crate::proto::ConnMemory::new(cfg.conn_memory.unwrap_or(cfg.store.memory));
        let shared = Arc::new(Shared::new(store, settings, max_lanes, lanes, mailboxes, conn_memory));
        let stop = Stop::new().map_err(io_err("create the stop signal"))?;
        let server = Server {
            shared: shared.clone(),
            stop: stop.clone(),
            threads: Mutex::new(Vec::new()),
            changing: Mutex::new(()),
            cfg: cfg.clone(),
            netns: NetnsHandle::current().map_err(|e| ServerError::Config(e.to_string()))?,
            tcp_addr,
            udp_addr,
            _sysctls: sysctls,
            _device_changes: device_changes,
        };
        let mut udp = udp.into_iter();
        let mut listeners = listeners.into_iter();
        let first_listener = match unix {
            Some(u) => Some(stream::Listener::Unix(u)),
            None if reuseport => None,
            None => listeners.next().map(stream::Listener::Tcp),
        };
        for lane in 0..cfg.threads {
            let cpu = match &cfg.cpus {
                Some(c) if !c.is_empty() => Some(c[lane % c.len()]),
                _ => queue_cpus.get(&lane).copied(),
            };
            server.spawn_lane(lane, cpu, udp.next(), listeners.next())?;
        }
        let acc = accept::Acceptor::new(first_listener, shared.clone(), stop.clone()).map_err(io_err("acceptor"))?;
        server.threads.lock().unwrap_or_else(|p| p.into_inner()).push((
            None,
            std::thread::Builder::new()
                .name("kv-accept".into())
                .spawn(move || acc.run())
                .map_err(io_err("spawn acceptor"))?,
        ));
        Ok(server)
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

/// Writes a sysctl of the calling thread's network namespace (under /proc/sys/net) and
/// reads it back.
/// Sets a sysctl for as long as the server runs (restored when it stops, and by
/// `netlane clean` after a kill), reported as a knob.
fn set_sysctl(path: &str, value: &str) -> (netlane::lanes::Knob, Option<netlane::installed::Sysctl>) {
    let name = path.trim_start_matches("/proc/sys/").replace('/', ".");
    match netlane::installed::Sysctl::set(path, value) {
        Ok(guard) => {
            let now = guard.read().unwrap_or_default();
            (netlane::lanes::Knob::new_applied(name, value, now), Some(guard))
        }
        Err(e) => (netlane::lanes::Knob::new_refused(name, value, e), None),
    }
}

fn bind_tcp(addr: SocketAddr, backlog: i32, reuseport: bool) -> Result<TcpListener, ServerError> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(io_err("TCP socket"))?;
    s.set_reuse_address(true).map_err(io_err("SO_REUSEADDR"))?;
    if reuseport {
        s.set_reuse_port(true).map_err(io_err("SO_REUSEPORT"))?;
    }
    s.bind(&addr.into()).map_err(io_err(format!("bind TCP {addr}")))?;
    s.listen(backlog).map_err(io_err(format!("listen on {addr}")))?;
    s.set_nonblocking(true).map_err(io_err("non-blocking listener"))?;
    Ok(s.into())
}

/// One UDP socket per worker in a `SO_REUSEPORT` group on `addr` (port 0: the first
/// socket's port for all).
fn bind_udp_group(addr: SocketAddr, n: usize) -> Result<Vec<UdpSocket>, ServerError> {
    use socket2::{Domain, Socket, Type};
    let mut out: Vec<UdpSocket> = Vec::new();
    let mut addr = addr;
    for _ in 0..n {
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, None).map_err(io_err("UDP socket"))?;
        s.set_reuse_port(true).map_err(io_err("SO_REUSEPORT"))?;
        s.bind(&addr.into()).map_err(io_err(format!("bind UDP {addr}")))?;
        s.set_nonblocking(true).map_err(io_err("non-blocking UDP"))?;
        let u: UdpSocket = s.into();
        if addr.port() == 0 {
            addr = u.local_addr().map_err(io_err("UDP local address"))?;
        }
        out.push(u);
    }
    Ok(out)
}
