//! The request/response server: one thread, one receive path, responses through the
//! service's UDP socket.
//!
//! The UDP socket stays bound on every path, so the kernel never answers the service's
//! port with ICMP port unreachable, and other sockets and capture tools keep working. The
//! thread sleeps in `epoll_wait` on the path's file descriptor when there is nothing to
//! read; a wake-up drains what is there (until `EAGAIN`, or 64 receive calls, so that
//! requests arriving as fast as they are answered cannot hold off a stop), answers, and
//! sleeps again.
//!
//! Files: `path/` the receive paths, `event_loop.rs` one thread serving one socket (the
//! set-up, the loop, the counters at the end), `respond.rs` a request's answer and its
//! delivery, `socket_tx.rs` responses through the socket (GSO), `rawtx.rs` responses as
//! frames, `paced.rs` paced responses, `lanes.rs` a socket and thread per receive queue,
//! `socket.rs` the service socket, `handle.rs` the server on a thread of its own
//! (`Server`); this file the options, the counters and `serve`.

mod event_loop;
mod handle;
mod lanes;
mod napi;
mod paced;
mod path;
mod rawtx;
mod respond;
mod socket;
mod socket_tx;
mod tcp;

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use netlane::lanes::{LaneId, LaneMap, ReuseportSteering};
use netlane::metrics::cpu::{CpuTime, thread_cpu};
use netlane::serve::Stop;
use netlane::time::monotonic_ns;
use netlane_sys::cmsg::CmsgBuf;
use netlane_sys::consts::UDP_MAX_SEGMENTS;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

pub use handle::Server;
pub use paced::{MAX_PACE_QUEUE, MAX_PACE_RATE, PaceOptions, PaceReport};
pub use path::{
    ADAPTIVE_BLOCKS, MAX_RING_BYTES, PathKind, RingOptions, RingSkips, RxPath, XdpOptions, memlock_limit, rx_queues,
};
pub use rawtx::{RawTxReport, TxKind};
pub use tcp::{MAX_CONNECTIONS, Transport};

use self::event_loop::serve_on;
use self::lanes::serve_lanes;
use self::respond::{answer, flush, recv_error};
use self::socket::{bind, interface};
use self::socket_tx::Tx;
use crate::proto::guard::{Admit, Guard, GuardConfig};
use crate::proto::server::{ConfigError, Refusal, ResponderConfig, respond, respond_to};
use crate::proto::wire::{self, Header, Kind};
use paced::Paced;
use rawtx::{RawTx, Sent};

/// Largest batch for `recvmmsg`.
pub const MAX_BATCH: usize = netlane_sys::msg::MAX_MMSG;

/// How a server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address and port of the service (port 0 picks one).
    pub listen: SocketAddr,
    /// The receive path.
    pub path: PathKind,
    /// Datagrams per `recvmmsg` call (the recvmmsg path).
    pub batch: usize,
    /// What responses look like.
    pub responder: ResponderConfig,
    /// CPU to pin the server thread to.
    pub cpu: Option<usize>,
    /// Socket receive buffer to ask for, bytes.
    pub recv_buffer: usize,
    /// Socket send buffer to ask for, bytes.
    pub send_buffer: usize,
    /// Stop after this long (None: until the stop signal).
    pub duration: Option<Duration>,
    /// Ring paths: the interface to read (None: the one that has the listen address,
    /// every interface for an unspecified address).
    pub iface: Option<String>,
    /// Ring paths: the ring's geometry.
    pub ring: RingOptions,
    /// AF_XDP: socket and UMEM sizes.
    pub xdp: XdpOptions,
    /// How responses leave.
    pub tx: TxKind,
    /// The packet transmit path: a response that goes as one frame leaves its UDP
    /// checksum to the device (`PACKET_VNET_HDR`); otherwise every checksum is summed
    /// in user space.
    pub tx_checksum_offload: bool,
    /// Pace responses (socket transmit, one datagram per response) instead of sending
    /// each as soon as it is ready.
    pub pace: Option<PaceOptions>,
    /// Lanes: a thread per receive queue (NAPI instance) of this device, each pinned
    /// to its queue's CPU with a socket of its own in an `SO_REUSEPORT` group whose BPF
    /// selector gives each datagram to the lane owning the NAPI id it arrived through.
    pub lane_device: Option<String>,
    /// What an unverified source may be sent (see `proto::guard`).
    pub guard: GuardConfig,
    /// Busy polling: the loop's epoll instance polls the NAPI instances of the sockets it
    /// reads before it sleeps (`EPIOCSPARAMS`), and each socket the path reads (every
    /// AF_XDP socket, a ring, the service socket) gets `SO_BUSY_POLL`, its budget and,
    /// with `prefer`, `SO_PREFER_BUSY_POLL` (interrupts stay off while the loop keeps
    /// polling, where the device defers them).
    pub busy_poll: Option<netlane::lanes::BusyPoll>,
    /// UDP datagrams on the receive path, or messages over a TCP connection per client
    /// (the comparator: the same answers, the stack's TCP in between).
    pub transport: Transport,
    /// TCP: the most connections served at once; more are closed as they come.
    pub max_connections: usize,
    /// Per-NAPI settings written to every NAPI instance of the device read (the lane
    /// device, else `iface` or the one holding the listen address) at start and put back
    /// when the server stops: with deferred interrupts a busy-polling server runs its
    /// queue alone.
    pub napi: netlane::topology::netdev::NapiSettings,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7070".parse().expect("a literal address"),
            path: PathKind::Recvmmsg,
            batch: 64,
            responder: ResponderConfig::default(),
            cpu: None,
            recv_buffer: 4 << 20,
            send_buffer: 4 << 20,
            duration: None,
            iface: None,
            ring: RingOptions::default(),
            xdp: XdpOptions::default(),
            tx: TxKind::Socket,
            tx_checksum_offload: true,
            pace: None,
            lane_device: None,
            guard: GuardConfig::default(),
            busy_poll: None,
            napi: netlane::topology::netdev::NapiSettings::default(),
            transport: Transport::Udp,
            max_connections: 1024,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A bad option.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A bad batch size.
    #[error("batch {0}: must be 1..={MAX_BATCH}")]
    Batch(usize),
    /// The path, the transmit path or the lanes need capabilities this process lacks.
    #[error(transparent)]
    Lacking(#[from] netlane::caps::Lacking),
    /// The receive path is not available in this build.
    #[error("receive path {0} is not available yet")]
    Unavailable(PathKind),
    /// A ring that cannot be built.
    #[error("{path} ring: {why}")]
    Ring {
        /// The path.
        path: PathKind,
        /// What is wrong.
        why: String,
    },
    /// A transmit path that cannot work with the other options.
    #[error("{0}")]
    Tx(String),
    /// No such interface, or none has the listen address.
    #[error("{0}")]
    Interface(String),
    /// Lanes that cannot be built.
    #[error("lanes: {0}")]
    Lanes(String),
    /// TCP options that cannot work.
    #[error("tcp: {0}")]
    Tcp(String),
    /// The device lanes were asked on cannot carry them.
    #[error("`lane_device`")]
    LaneDevice(#[source] netlane::lanes::queues::LaneDeviceError),
    /// The options could take more memory than the machine has.
    #[error(transparent)]
    Memory(#[from] netlane::memory::MemoryError),
    /// A system call failed while setting up.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
    /// The per-NAPI settings could not be written.
    #[error("per-NAPI settings on {dev}")]
    Napi {
        /// The device.
        dev: String,
        /// Why.
        #[source]
        source: netlane::topology::TopologyError,
    },
    /// The server's thread ended without its result (it panicked), or before it was
    /// ready without an error.
    #[error("the server thread {0}")]
    Thread(&'static str),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io(netlane::error::IoError::new(what, source))
}

impl ServerConfig {
    /// The AF_XDP options as the path uses them: the first queue's socket keeps
    /// transmit frames when responses leave through it.
    fn xdp_options(&self) -> XdpOptions {
        XdpOptions { transmit: self.tx == TxKind::AfXdp, ..self.xdp }
    }

    /// The memory the server may take at its limits: socket buffers, the ring or UMEM
    /// of a path below the stack (each interface read has its own), paced responses.
    pub fn memory_ask(&self) -> netlane::memory::Ask {
        let mut ask = netlane::memory::Ask::new().add("socket buffers", (self.recv_buffer + self.send_buffer) as u64);
        if self.path.is_ring()
            && let Ok(spec) = self.ring.spec(self.path)
        {
            ask = ask.add(format!("a {} ring", self.path), spec.bytes() as u64);
        }
        if let (PathKind::AfXdp, Ok(x)) = (self.path, self.xdp_options().check(1, None)) {
            ask = ask.add("a UMEM", x.umem_bytes() as u64);
        }
        if let Some(p) = &self.pace {
            let bytes = p.queue as u64 * u64::from(self.responder.max_response);
            ask = ask.add(format!("{} paced responses", p.queue), bytes);
        }
        if self.transport == Transport::Tcp {
            let bytes = self.max_connections as u64 * tcp::connection_bytes(self) as u64;
            ask = ask.add(format!("{} TCP connections at their limits", self.max_connections), bytes);
        }
        ask
    }

    /// Refuses, before anything is set up, a path this process lacks the capabilities
    /// for, naming them: packet rings need CAP_NET_RAW; AF_XDP that and CAP_BPF and
    /// CAP_NET_ADMIN for its program; lanes CAP_BPF for their reuseport selector.
    pub fn check_capabilities(&self) -> Result<(), netlane::caps::Lacking> {
        use netlane::caps::{Cap, require};
        let path: &[Cap] = match self.path {
            PathKind::AfXdp => &[Cap::NetRaw, Cap::Bpf, Cap::NetAdmin],
            // The adaptive rings' fanout program is BPF.
            p if p.is_ring() && self.ring.adaptive => &[Cap::NetRaw, Cap::Bpf],
            p if p.is_ring() => &[Cap::NetRaw],
            _ => &[],
        };
        require(&format!("the {} path", self.path), path)?;
        if self.tx == TxKind::Packet {
            require("the packet transmit path", &[Cap::NetRaw])?;
        }
        if self.lane_device.is_some() {
            require("lanes (their reuseport selector)", &[Cap::Bpf])?;
        }
        Ok(())
    }

    /// Checks every option before anything is built.
    pub fn validate(&self) -> Result<(), ServerError> {
        self.responder.validate()?;
        if self.transport == Transport::Tcp {
            if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
                return Err(ServerError::Tcp(format!(
                    "`max_connections` {}: at least one, at most {MAX_CONNECTIONS}",
                    self.max_connections
                )));
            }
            let datagram_only = self.path.is_frames()
                || self.tx != TxKind::Socket
                || self.pace.is_some()
                || self.lane_device.is_some()
                || self.busy_poll.is_some();
            if datagram_only {
                return Err(ServerError::Tcp(
                    "TCP reads its connections through the stack: no frame path, frame transmit, pacing, lanes or \
                     busy polling"
                        .into(),
                ));
            }
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return Err(ServerError::Batch(self.batch));
        }
        if !self.path.available() {
            return Err(ServerError::Unavailable(self.path));
        }
        if self.path.is_ring() {
            self.ring.spec(self.path).map_err(|why| ServerError::Ring { path: self.path, why })?;
        }
        if self.ring.adaptive && self.path != PathKind::TpacketV3 {
            return Err(ServerError::Ring {
                path: self.path,
                why: "the adaptive block size is a TPACKET_V3 mode".into(),
            });
        }
        if self.path == PathKind::AfXdp {
            // One queue at least; the queue count is known once the interface is.
            self.xdp_options().check(1, memlock_limit()).map_err(|why| ServerError::Ring { path: self.path, why })?;
        }
        if self.tx != TxKind::Socket && self.listen.ip().is_unspecified() {
            return Err(ServerError::Tx(format!(
                "`tx` {}: frames need a source address; listen on a specific address, not {}",
                self.tx,
                self.listen.ip()
            )));
        }
        if let Some(p) = &self.pace {
            p.check().map_err(ServerError::Tx)?;
            if self.tx != TxKind::Socket || self.responder.segment.is_some() {
                return Err(ServerError::Tx(
                    "pacing sends each response as one datagram through the socket: it cannot be combined with \
                     --tx packet/af-xdp or --segment"
                        .into(),
                ));
            }
        }
        if let Some(dev) = &self.lane_device
            && (self.path.is_frames() || self.tx != TxKind::Socket || self.pace.is_some() || self.cpu.is_some())
        {
            return Err(ServerError::Lanes(format!(
                "`lane_device` {dev}: lanes read and answer through their sockets (`path` recvmmsg or \
                 recvmsg, `tx` socket, no `pace`) and pin themselves to their queues' CPUs (no `cpu`)"
            )));
        }
        if self.tx == TxKind::AfXdp && self.path != PathKind::AfXdp {
            return Err(ServerError::Tx(format!(
                "`tx` af-xdp sends through the AF_XDP socket: it needs `path` af-xdp, not {}",
                self.path
            )));
        }
        Ok(())
    }
}

netlane::counters! {
    /// What a server, or one lane of it, counted.
    #[derive(Serialize, Deserialize, schemars::JsonSchema)]
    pub struct RrCounters, shared SharedRrCounters {
        /// Datagrams the path delivered (TCP: requests read off the connections).
        frames,
        /// Requests answered.
        responses,
        /// Datagrams sent (a segmented response is several).
        datagrams_sent,
        /// Bytes sent (UDP payload; TCP: the messages' bytes).
        bytes_sent,
        /// Sends that carried several segments (GSO).
        gso_sends,
        /// Datagrams that were not valid requests.
        refused_malformed,
        /// Responses sent to the server.
        refused_not_request,
        /// Requests asking for more than the server sends (each answered with a refusal
        /// naming the limit).
        refused_too_large,
        /// Requests from an unverified source answered with a Retry instead (the response
        /// was over the ratio to the request, or over the source's byte budget).
        retries_sent,
        /// Requests that carried a valid cookie.
        verified_requests,
        /// Responses the socket would not take within a second (the client will ask again).
        send_dropped,
        /// Other send errors.
        send_errors,
        /// Receive errors (ICMP errors queued on the socket, among others).
        recv_errors,
        /// Ring paths: IP fragments seen (the ring gets them unassembled; they are
        /// reassembled here, within the kernel's default bounds: 30 s, 4 MiB).
        ring_fragments,
        /// Ring paths: datagrams reassembled from fragments (then taken like whole ones).
        ring_reassembled,
        /// Ring paths: fragmented datagrams given up: their 30 s ran out, or 64 fragments
        /// came from their source since their last (a fragment was lost).
        ring_reasm_given_up,
        /// Ring paths: fragments dropped because the reassembler's memory (4 MiB, 1 MiB
        /// from one source address) was full.
        ring_reasm_over_memory,
        /// Ring paths: fragments that overlapped others, duplicated one, lay past 65,535
        /// bytes or the datagram's end, or were empty or not a multiple of 8 bytes with
        /// more to follow (their datagrams, but for duplicates, are dropped whole).
        ring_reasm_refused,
        /// Ring and AF_XDP paths: frames with a wrong IPv4 header or UDP checksum (the
        /// stack drops them; so does the path).
        ring_bad_checksums,
        /// Ring paths: other frames that were not a whole datagram for the service.
        ring_skipped,
        /// Ring paths: frames the kernel dropped because the ring was full (counted when
        /// the server stops: reading them resets the kernel's count).
        ring_drops,
        /// TPACKET_V3: times every block was held by the server (the ring froze; counted
        /// when the server stops).
        ring_freezes,
        /// `epoll_wait` returns with something to read.
        wakeups,
        /// `epoll_wait` calls.
        polls,
        /// TCP: connections accepted and served (not those closed over the limit).
        connections,
        /// TCP: connections closed as they came, over the limit.
        connections_refused,
        /// Receive system calls (including the one that found nothing).
        recv_syscalls,
        /// Send system calls.
        send_syscalls,
    }
}

/// A server's counters, returned when it stops.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServerStats {
    /// The receive path.
    pub path: String,
    /// The address served.
    pub listen: String,
    /// Seconds served.
    pub seconds: f64,
    /// What it counted.
    #[serde(flatten)]
    pub counters: RrCounters,
    /// Ring paths: the interface read ("all" for every interface).
    pub iface: Option<String>,
    /// Adaptive TPACKET_V3: ring switches, and the block size in use at the end.
    pub adaptive_switches: Option<u64>,
    /// Adaptive TPACKET_V3: block bytes of the ring in use at the end.
    pub adaptive_block: Option<u32>,
    /// Adaptive TPACKET_V3: frames each ring delivered, by ascending block size (4 KiB
    /// first); they add up to `frames`, each frame reaching one ring.
    pub adaptive_ring_frames: Option<Vec<u64>>,
    /// CPU seconds of the server thread.
    pub cpu_s: f64,
    /// Share of the time the server thread was on a CPU (1 = never idle).
    pub busy: f64,
    /// AF_XDP: how it ran.
    pub xdp: Option<XdpReport>,
    /// How responses left: "socket", "packet", "af-xdp", or "tcp" (the TCP comparator,
    /// whose `path` is "tcp" too).
    pub tx: String,
    /// Paced responses: what the schedule did.
    pub paced: Option<PaceReport>,
    /// Frame transmit paths: what they did (responses they could not take went
    /// through the socket, counted here by reason).
    pub raw_tx: Option<RawTxReport>,
    /// Datagrams per wake-up.
    pub frames_per_wakeup: f64,
    /// System calls (receive, send, epoll) per request answered.
    pub syscalls_per_response: f64,
    /// Lanes: each lane's share, and how the selector placed datagrams.
    pub lanes: Option<LanesReport>,
    /// Busy polling: each knob as applied (read back) or refused, and what it did.
    pub busy_poll: Option<BusyPollReport>,
    /// The per-NAPI settings, each applied (read back) or refused; empty when none were
    /// asked for.
    #[serde(default)]
    pub napi: Vec<netlane::lanes::Knob>,
}

impl ServerStats {
    /// Sets the ratios read from the counters: datagrams per wake-up, system calls per
    /// response.
    fn derive_ratios(&mut self) {
        let c = &self.counters;
        self.frames_per_wakeup = if c.wakeups > 0 { c.frames as f64 / c.wakeups as f64 } else { 0.0 };
        self.syscalls_per_response = if c.responses > 0 {
            (c.recv_syscalls + c.send_syscalls + c.polls) as f64 / c.responses as f64
        } else {
            0.0
        };
    }
}

/// How busy polling ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BusyPollReport {
    /// The policy asked for (`USECS,BUDGET[,prefer]`).
    pub policy: String,
    /// Each knob: the epoll instance's parameters, and each socket's options.
    pub knobs: Vec<netlane::lanes::Knob>,
    /// Packets the NAPI instances handed over while a reader busy polled them, in the
    /// server's network namespace over the run (the kernel's `BusyPollRxPackets`; every
    /// reader of the namespace counts, not only this server); `None` when unreadable.
    pub rx_packets: Option<u64>,
    /// The NAPI id of each socket busy polling concerned, at the end, by name: what
    /// busy polling polls (0: the kernel gave the socket none, so there was nothing to
    /// poll; null: it could not be read).
    pub napi_ids: Vec<(String, Option<u32>)>,
}

/// How a server with lanes ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LanesReport {
    /// The device whose queues the lanes own.
    pub device: String,
    /// Each lane.
    pub lanes: Vec<RrLane>,
    /// Datagrams the selector gave to the lane owning their NAPI id.
    pub by_napi_id: u64,
    /// Datagrams it left to the kernel's hash (NAPI id 0 or one no lane owns).
    pub by_hash: u64,
}

/// One lane of a server.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RrLane {
    /// Lane number (its socket's index in the group).
    pub lane: usize,
    /// The CPU it ran on (its queue's NAPI CPU), if known.
    pub cpu: Option<usize>,
    /// The NAPI ids it owns.
    pub napi_ids: Vec<u32>,
    /// Datagrams it read.
    pub frames: u64,
    /// Requests it answered.
    pub responses: u64,
    /// CPU seconds of its thread.
    pub cpu_s: f64,
}

/// How the AF_XDP path ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct XdpReport {
    /// Where the steering program ran: "native" (driver) or "generic" (skb).
    pub mode: String,
    /// Why native mode was not had: the driver's refusal (tried first).
    pub native_refused: Option<String>,
    /// Whether the sockets were bound zero-copy (copy mode otherwise: the driver refused).
    pub zero_copy: bool,
    /// Why zero-copy was not had: the driver's refusal (tried first, unless copy mode was
    /// asked for).
    pub zero_copy_refused: Option<String>,
    /// Receive queues, one socket each.
    pub queues: usize,
    /// Frames each queue's socket delivered, in queue order.
    pub frames_per_queue: Vec<u64>,
    /// Frames the program redirected to the sockets.
    pub redirected: u64,
    /// Frames it passed to the stack (everything not for the service).
    pub passed: u64,
    /// Requests that reached the service through the stack (IP fragments, reassembled).
    pub via_stack: u64,
    /// Times a frame found no free UMEM frame in the fill ring.
    pub fill_ring_empty: u64,
    /// Invalid descriptors.
    pub invalid_descs: u64,
}

/// Serves until `stop` is given (or the configured duration passes). `on_ready` gets the
/// bound address once the path is ready to receive.
pub fn serve(cfg: &ServerConfig, stop: &Stop, on_ready: impl FnOnce(SocketAddr)) -> Result<ServerStats, ServerError> {
    serve_counted(cfg, stop, &SharedRrCounters::default(), on_ready)
}

/// [`serve`], every lane adding what it counted to `live` as it goes (about ten times a
/// second): what a metrics endpoint or a periodic line reads while it runs.
pub fn serve_counted(
    cfg: &ServerConfig,
    stop: &Stop,
    live: &SharedRrCounters,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<ServerStats, ServerError> {
    cfg.validate()?;
    cfg.check_capabilities()?;
    cfg.memory_ask().check()?;
    if cfg.transport == Transport::Tcp {
        return tcp::serve(cfg, stop, live, on_ready);
    }
    // One key for every lane's cookies: a client whose datagrams move to another lane
    // keeps its cookie.
    let keys = std::collections::hash_map::RandomState::new();
    // Held until the server stops, then put back.
    let (napi, _changed) = napi::apply(cfg)?;
    let mut stats = match &cfg.lane_device {
        Some(dev) => serve_lanes(cfg, dev, &keys, stop, live, on_ready)?,
        None => serve_on(cfg, bind(cfg, cfg.listen, false)?, &keys, stop, live, on_ready)?,
    };
    stats.napi = napi;
    Ok(stats)
}
