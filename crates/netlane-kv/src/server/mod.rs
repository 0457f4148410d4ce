//! The cache server: an acceptor thread and one epoll worker per thread over the
//! sans-IO [`proto`](crate::proto) core and one shared [`Store`].
//!
//! - **Connections belong to one worker** for their whole life: the acceptor takes a
//!   connection and hands it to a worker chosen by [`Placement`] (round robin today;
//!   the lanes work places by receive queue / NAPI id instead). A worker registers it
//!   edge-triggered once and never re-arms it.
//! - **Per request**, a worker does one `read`, runs every complete command, and one
//!   `write` of all the replies (a read shorter than the buffer means the socket is
//!   drained, so no extra read to find `EAGAIN`).
//! - **UDP** (memcached's `-U`): one `SO_REUSEPORT` socket per worker on the same port.
//! - **Bounds**: a connection limit (over it a client gets memcached's
//!   `ERROR Too many open connections` and is closed), an idle timeout, and the
//!   per-connection buffer bounds of [`Limits`].
//! - **Stop**: [`Server::stop`] wakes every thread, writes what each connection has
//!   pending (best effort, non-blocking), closes, and returns the final counters.

mod accept;
mod host;
mod worker;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::proto::Limits;
use crate::store::{ConfigError, Store, StoreConfig};

use host::Shared;
pub use host::{ServerStats, Settings};

/// What a server is started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// TCP address to listen on (port 0 picks one).
    pub listen: SocketAddr,
    /// Also serve UDP on this port of the listen address (0 picks one).
    pub udp_port: Option<u16>,
    /// Worker threads.
    pub threads: usize,
    /// The store's limits.
    pub store: StoreConfig,
    /// Per-connection bounds.
    pub limits: Limits,
    /// Most simultaneous connections (memcached's `-c`).
    pub max_conns: usize,
    /// Close connections idle this long (memcached's `idle_timeout`; `None`: never).
    pub idle_timeout: Option<Duration>,
    /// CPUs to pin workers to, in order (wrapping); `None`: not pinned.
    pub cpus: Option<Vec<usize>>,
    /// The listen backlog.
    pub backlog: i32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 11211)),
            udp_port: None,
            threads: 4,
            store: StoreConfig::default(),
            limits: Limits::default(),
            max_conns: 1024,
            idle_timeout: None,
            cpus: None,
            backlog: 1024,
        }
    }
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A bad configuration value.
    #[error("{0}")]
    Config(String),
    /// The store's limits cannot work.
    #[error(transparent)]
    Store(#[from] ConfigError),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
}

/// How the acceptor picks a worker for a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Each new connection to the next worker.
    #[default]
    RoundRobin,
}

impl ServerConfig {
    /// Checks the values before anything is bound.
    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |m: String| Err(ServerError::Config(m));
        if !(1..=256).contains(&self.threads) {
            return bad(format!("--threads {}: must be 1..=256", self.threads));
        }
        if !(1..=1_000_000).contains(&self.max_conns) {
            return bad(format!("--max-conns {}: must be 1..=1000000", self.max_conns));
        }
        if self.idle_timeout.is_some_and(|d| d < Duration::from_secs(1)) {
            return bad("--idle-timeout must be at least 1s".into());
        }
        let l = &self.limits;
        if !(256..=1 << 20).contains(&l.max_line) || l.max_get_line < l.max_line || l.max_get_line > 64 << 20 {
            return bad(format!(
                "line limits {} / {} bytes: the line limit must be 256 B..=1 MiB and the get-line limit at least that, at most 64 MiB",
                l.max_line, l.max_get_line
            ));
        }
        if l.commands_per_turn == 0 || l.read_chunk < 1024 || l.output_pause < 4096 {
            return bad("connection limits: commands per turn >= 1, read chunk >= 1 KiB, output pause >= 4 KiB".into());
        }
        if let Some(c) = &self.cpus {
            netlane::cpus::CpuList::new(c.clone()).check_online().map_err(|e| ServerError::Config(e.to_string()))?;
        }
        Ok(())
    }
}

/// A worker's mailbox: connections handed over by the acceptor, and its wake-up.
#[derive(Debug)]
struct Mailbox {
    inbox: Mutex<Vec<std::net::TcpStream>>,
    wake: EventFd,
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    mailboxes: Vec<Arc<Mailbox>>,
    threads: Vec<JoinHandle<()>>,
    tcp_addr: SocketAddr,
    udp_addr: Option<SocketAddr>,
}

impl Server {
    /// Binds, builds the store and starts the threads.
    pub fn start(cfg: ServerConfig) -> Result<Server, ServerError> {
        cfg.validate()?;
        let store = Store::new(cfg.store)?;
        let listener = bind_tcp(cfg.listen, cfg.backlog)?;
        let tcp_addr = listener.local_addr().map_err(io_err("local address"))?;
        let udp = match cfg.udp_port {
            None => Vec::new(),
            Some(port) => bind_udp_group(SocketAddr::new(tcp_addr.ip(), port), cfg.threads)?,
        };
        let udp_addr = udp.first().map(|s| s.local_addr()).transpose().map_err(io_err("UDP local address"))?;
        let settings = Settings {
            tcp_port: tcp_addr.port(),
            udp_port: udp_addr.map_or(0, |a| a.port()),
            threads: cfg.threads,
            max_conns: cfg.max_conns,
            item_size_max: cfg.store.item_max,
            maxbytes: cfg.store.memory,
            idle_timeout_s: cfg.idle_timeout.map_or(0, |d| d.as_secs()),
            limits: cfg.limits,
            shards: store.shard_count(),
        };
        let shared = Arc::new(Shared::new(store, settings, cfg.threads));
        let stop = Arc::new(AtomicBool::new(false));
        let mut mailboxes = Vec::new();
        for _ in 0..cfg.threads {
            let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| ServerError::Io { what: "eventfd".into(), source: e.into() })?;
            mailboxes.push(Arc::new(Mailbox { inbox: Mutex::new(Vec::new()), wake }));
        }
        let mut threads = Vec::new();
        let mut udp = udp.into_iter();
        for (i, mb) in mailboxes.iter().enumerate() {
            let w = worker::Worker::new(
                i,
                shared.clone(),
                mb.clone(),
                stop.clone(),
                cfg.limits,
                cfg.idle_timeout,
                udp.next(),
            )
            .map_err(io_err(format!("worker {i}")))?;
            let cpu = cfg.cpus.as_ref().and_then(|c| (!c.is_empty()).then(|| c[i % c.len()]));
            let t = std::thread::Builder::new()
                .name(format!("kv-worker-{i}"))
                .spawn(move || {
                    netlane::cpus::pin(cpu);
                    w.run();
                })
                .map_err(io_err("spawn worker"))?;
            threads.push(t);
        }
        let acc =
            accept::Acceptor::new(listener, shared.clone(), mailboxes.clone(), stop.clone(), Placement::RoundRobin)
                .map_err(io_err("acceptor"))?;
        threads.push(
            std::thread::Builder::new()
                .name("kv-accept".into())
                .spawn(move || acc.run())
                .map_err(io_err("spawn acceptor"))?,
        );
        Ok(Server { shared, stop, mailboxes, threads, tcp_addr, udp_addr })
    }

    /// The TCP address served.
    pub fn local_addr(&self) -> SocketAddr {
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

    /// Whether a thread has ended (it only does on a fatal error).
    pub fn failed(&self) -> bool {
        self.threads.iter().any(JoinHandle::is_finished)
    }

    /// Stops every thread, closes every connection, and returns the final counters.
    pub fn stop(mut self) -> ServerStats {
        self.shutdown();
        self.shared.snapshot()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        for mb in &self.mailboxes {
            let _ = mb.wake.write(1);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn bind_tcp(addr: SocketAddr, backlog: i32) -> Result<TcpListener, ServerError> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(io_err("TCP socket"))?;
    s.set_reuse_address(true).map_err(io_err("SO_REUSEADDR"))?;
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
