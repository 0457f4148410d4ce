//! What a server is started with: [`ServerConfig`] (and the Unix socket it may serve),
//! its defaults, its checks, and the settings it reports from it.

use std::net::SocketAddr;
use std::time::Duration;

use netlane::lanes::BusyPoll;
use netlane::topology::netdev::NapiSettings;

use super::{ServerError, Settings, Steer};
use crate::proto::Limits;
use crate::store::StoreConfig;

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

    pub(super) fn max_lanes(&self) -> usize {
        self.max_lanes.unwrap_or(self.threads)
    }

    /// What the server reports it runs with, once bound: the ports it got and the
    /// store's shards.
    pub(super) fn settings(
        &self,
        shards: usize,
        tcp_addr: Option<SocketAddr>,
        udp_addr: Option<SocketAddr>,
    ) -> Settings {
        Settings {
            tcp_port: tcp_addr.map_or(0, |a| a.port()),
            udp_port: udp_addr.map_or(0, |a| a.port()),
            threads: self.threads,
            max_conns: self.max_conns,
            item_size_max: self.store.item_max,
            maxbytes: self.store.memory,
            idle_timeout_s: self.idle_timeout.map_or(0, |d| d.as_secs()),
            limits: self.limits,
            shards,
            proto: self.proto,
            unix_socket: self.unix.as_ref().map(|u| u.path.clone()),
            unix_mask: self.unix.as_ref().map_or(0o700, |u| u.mask),
            backlog: self.backlog,
            growth_factor: self.store.classes.map_or(1.25, |c| c.factor),
            chunk_size: self.store.classes.map_or(48, |c| c.min_size),
        }
    }
}
