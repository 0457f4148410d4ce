//! The request/response server: one thread, one receive path, responses through the
//! service's UDP socket.
//!
//! The UDP socket stays bound on every path, so the kernel never answers the service's
//! port with ICMP port unreachable, and other sockets and capture tools keep working. The
//! thread sleeps in `epoll_wait` on the path's file descriptor when there is nothing to
//! read; a wake-up drains what is there (until `EAGAIN`), answers, and sleeps again.

mod paced;
mod path;
mod rawtx;

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use netlane::lanes::{LaneId, LaneMap, ReuseportSteering};
use netlane::metrics::cpu::thread_cpu;
use netlane::serve::Stop;
use netlane::time::monotonic_ns;
use netlane_sys::cmsg::CmsgBuf;
use netlane_sys::consts::UDP_MAX_SEGMENTS;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use serde::Serialize;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

pub use paced::{MAX_PACE_QUEUE, MAX_PACE_RATE, PaceOptions, PaceReport};
pub use path::{
    ADAPTIVE_BLOCKS, MAX_RING_BYTES, PathKind, RingOptions, RingSkips, RxPath, XdpOptions, memlock_limit, rx_queues,
};
pub use rawtx::{RawTxReport, TxKind};

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
    /// Stop after this long (None: until the stop flag).
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
    /// Pace responses (socket transmit, one datagram per response) instead of sending
    /// each as soon as it is ready.
    pub pace: Option<PaceOptions>,
    /// Lanes: a thread per receive queue (NAPI instance) of this device, each pinned
    /// to its queue's CPU with a socket of its own in an `SO_REUSEPORT` group whose BPF
    /// selector gives each datagram to the lane owning the NAPI id it arrived through.
    pub lane_device: Option<String>,
    /// What an unverified source may be sent (see `proto::guard`).
    pub guard: GuardConfig,
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
            pace: None,
            lane_device: None,
            guard: GuardConfig::default(),
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
    /// The device lanes were asked on cannot carry them.
    #[error("`lane_device`")]
    LaneDevice(#[source] netlane::lanes::queues::LaneDeviceError),
    /// The options could take more memory than the machine has.
    #[error(transparent)]
    Memory(#[from] netlane::memory::MemoryError),
    /// A system call failed while setting up.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
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
        ask
    }

    /// Checks every option before anything is built.
    pub fn validate(&self) -> Result<(), ServerError> {
        self.responder.validate()?;
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

/// A server's counters, returned when it stops.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct ServerStats {
    /// The receive path.
    pub path: String,
    /// The address served.
    pub listen: String,
    /// Seconds served.
    pub seconds: f64,
    /// Datagrams the path delivered.
    pub frames: u64,
    /// Requests answered.
    pub responses: u64,
    /// Datagrams sent (a segmented response is several).
    pub datagrams_sent: u64,
    /// Bytes sent (UDP payload).
    pub bytes_sent: u64,
    /// Sends that carried several segments (GSO).
    pub gso_sends: u64,
    /// Datagrams that were not valid requests.
    pub refused_malformed: u64,
    /// Responses sent to the server.
    pub refused_not_request: u64,
    /// Requests asking for more than the server sends (each answered with a refusal
    /// naming the limit).
    pub refused_too_large: u64,
    /// Requests from an unverified source answered with a Retry instead (the response
    /// was over the ratio to the request, or over the source's byte budget).
    pub retries_sent: u64,
    /// Requests that carried a valid cookie.
    pub verified_requests: u64,
    /// Responses the socket would not take within a second (the client will ask again).
    pub send_dropped: u64,
    /// Other send errors.
    pub send_errors: u64,
    /// Receive errors (ICMP errors queued on the socket, among others).
    pub recv_errors: u64,
    /// Ring paths: the interface read ("all" for every interface).
    pub iface: Option<String>,
    /// Ring paths: IP fragments seen (the ring gets them unassembled; not answered).
    pub ring_fragments: u64,
    /// Ring and AF_XDP paths: frames with a wrong IPv4 header or UDP checksum (the
    /// stack drops them; so does the path).
    pub ring_bad_checksums: u64,
    /// Ring paths: other frames that were not a whole datagram for the service.
    pub ring_skipped: u64,
    /// Ring paths: frames the kernel dropped because the ring was full.
    pub ring_drops: u64,
    /// TPACKET_V3: times every block was held by the server (the ring froze).
    pub ring_freezes: u64,
    /// Adaptive TPACKET_V3: ring switches, and the block size in use at the end.
    pub adaptive_switches: Option<u64>,
    /// Adaptive TPACKET_V3: block bytes of the ring in use at the end.
    pub adaptive_block: Option<u32>,
    /// Adaptive TPACKET_V3: frames each ring delivered, by ascending block size (4 KiB
    /// first); they add up to `frames`, each frame reaching one ring.
    pub adaptive_ring_frames: Option<Vec<u64>>,
    /// `epoll_wait` returns with something to read.
    pub wakeups: u64,
    /// `epoll_wait` calls.
    pub polls: u64,
    /// Receive system calls (including the one that found nothing).
    pub recv_syscalls: u64,
    /// Send system calls.
    pub send_syscalls: u64,
    /// CPU seconds of the server thread.
    pub cpu_s: f64,
    /// Share of the time the server thread was on a CPU (1 = never idle).
    pub busy: f64,
    /// AF_XDP: how it ran.
    pub xdp: Option<XdpReport>,
    /// How responses left: "socket", "packet" or "af-xdp".
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
}

/// How a server with lanes ran.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct XdpReport {
    /// Where the steering program ran: "native" (driver) or "generic" (skb).
    pub mode: String,
    /// Whether the sockets were bound zero-copy (copy mode otherwise: the driver refused).
    pub zero_copy: bool,
    /// Receive queues, one socket each.
    pub queues: usize,
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
    cfg.validate()?;
    cfg.memory_ask().check()?;
    // One key for every lane's cookies: a client whose datagrams move to another lane
    // keeps its cookie.
    let keys = std::collections::hash_map::RandomState::new();
    if let Some(dev) = &cfg.lane_device {
        return serve_lanes(cfg, dev, &keys, stop, on_ready);
    }
    let sock = bind(cfg, cfg.listen, false)?;
    serve_on(cfg, sock, &keys, stop, on_ready)
}

/// Serves on `sock` on the calling thread (pinned to `cfg.cpu`).
fn serve_on(
    cfg: &ServerConfig,
    sock: UdpSocket,
    keys: &std::collections::hash_map::RandomState,
    stop: &Stop,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<ServerStats, ServerError> {
    netlane::cpus::pin(cfg.cpu);
    let local = sock.local_addr().map_err(io_err("local address"))?;
    let (ifindex, iface) = if cfg.path.is_frames() { interface(cfg)? } else { (0, None) };
    let name = iface.clone().unwrap_or_default();
    let mut path = RxPath::new(cfg.path, &sock, cfg.batch, &cfg.ring, &cfg.xdp_options(), (ifindex, &name))
        .map_err(io_err(format!("set up the {} path", cfg.path)))?;
    let mut raw = match cfg.tx {
        TxKind::Socket => None,
        TxKind::Packet => Some(RawTx::packet(local).map_err(io_err("set up the packet transmit path"))?),
        TxKind::AfXdp => {
            let RxPath::Xdp(x) = &mut path else { unreachable!("validated: tx af-xdp needs path af-xdp") };
            let ifindex = x.ifindex();
            let tx = x.take_tx().ok_or_else(|| io_err("AF_XDP transmit ring")(io::Error::other("none was set up")))?;
            Some(RawTx::xdp(local, tx, ifindex).map_err(io_err("set up the AF_XDP transmit path"))?)
        }
    };
    let _ = path.take_ring_stats();
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| io_err("epoll")(e.into()))?;
    ep.add(stop.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, STOP)).map_err(|e| io_err("epoll add")(e.into()))?;
    for fd in path.fds(&sock) {
        ep.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, FRAMES)).map_err(|e| io_err("epoll add")(e.into()))?;
    }
    if path.reads_stack_too() {
        ep.add(sock.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, STACK)).map_err(|e| io_err("epoll add")(e.into()))?;
    }
    if let Some(r) = &raw {
        ep.add(r.events_fd(), EpollEvent::new(EpollFlags::EPOLLIN, ROUTES))
            .map_err(|e| io_err("epoll add")(e.into()))?;
    }
    let mut paced = cfg.pace.map(Paced::new).transpose().map_err(io_err("set up pacing"))?;
    if let Some(p) = &paced {
        ep.add(p.timer_fd(), EpollEvent::new(EpollFlags::EPOLLIN, PACE)).map_err(|e| io_err("epoll add")(e.into()))?;
    }
    let mut tx = Tx::new(&sock);
    let mut out = vec![0u8; cfg.responder.max_reply_bytes()];
    let mut st = ServerStats {
        path: cfg.path.to_string(),
        listen: local.to_string(),
        iface,
        tx: cfg.tx.to_string(),
        ..ServerStats::default()
    };
    on_ready(local);

    let started = Instant::now();
    let cpu0 = thread_cpu();
    let mut guard = Guard::new(cfg.guard, keys.clone());
    // One slot per token.
    let mut events = [EpollEvent::empty(); 5];
    while !stop.is_stopped() && cfg.duration.is_none_or(|d| started.elapsed() < d) {
        st.polls += 1;
        // Frames a full device queue or send buffer left behind are kicked again soon,
        // whether or not a request comes.
        let wait_ms: u16 = if raw.as_ref().is_some_and(RawTx::pending) { 1 } else { 100 };
        let n = match ep.wait(&mut events, EpollTimeout::from(wait_ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io_err("epoll_wait")(e.into())),
        };
        if n == 0 {
            flush(&mut raw, &mut st);
            continue;
        }
        if events[..n].iter().any(|e| e.data() == STOP) {
            continue;
        }
        let only_timer = events[..n].iter().all(|e| e.data() == PACE);
        if !only_timer {
            st.wakeups += 1;
        }
        let frames_ready = events[..n].iter().any(|e| e.data() == FRAMES);
        let stack_ready = events[..n].iter().any(|e| e.data() == STACK);
        if let Some(r) = raw.as_mut().filter(|_| events[..n].iter().any(|e| e.data() == ROUTES)) {
            r.process_events();
        }
        // Drain: the path returns what it has; stop when it says it is empty.
        let mut more = frames_ready;
        while more {
            let mut got = 0;
            let r = path.recv(&sock, &mut |data, from| {
                got += 1;
                answer(cfg, (&mut tx, &mut raw, &mut paced), &mut guard, &mut out, &mut st, data, from);
            });
            flush(&mut raw, &mut st);
            if !cfg.path.is_frames() {
                st.recv_syscalls += 1;
            }
            more = match r {
                Ok(_) if got > 0 => {
                    st.frames += got;
                    true
                }
                Ok(_) => false,
                Err(e) => recv_error(e, &mut st),
            };
        }
        // AF_XDP: requests the program passed to the stack, read only when the socket
        // has some (no extra system call per wake-up otherwise).
        let mut more = stack_ready;
        while more {
            st.recv_syscalls += 1;
            let r = path.recv_stack(&sock, &mut |data, from| {
                answer(cfg, (&mut tx, &mut raw, &mut paced), &mut guard, &mut out, &mut st, data, from)
            });
            flush(&mut raw, &mut st);
            more = match r {
                Ok(got) => {
                    st.frames += got as u64;
                    true
                }
                Err(e) => recv_error(e, &mut st),
            };
        }
        // Paced responses: what the schedule allows now; the timer wakes us for the rest.
        if let Some(p) = &mut paced
            && let Err(e) = p.release(&sock)
        {
            tracing::debug!(error = %e, "paced send failed");
            st.send_errors += 1;
        }
    }
    if let Some(p) = &mut paced {
        let unsent = p.finish(&sock);
        st.send_dropped += unsent as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    st.seconds = seconds;
    st.cpu_s = thread_cpu().total_s() - cpu0.total_s();
    st.busy = if seconds > 0.0 { (st.cpu_s / seconds).min(1.0) } else { 0.0 };
    st.frames_per_wakeup = if st.wakeups > 0 { st.frames as f64 / st.wakeups as f64 } else { 0.0 };
    st.send_syscalls = tx.syscalls;
    st.gso_sends = tx.gso_sends;
    let skips = path.skips();
    let ring = path.take_ring_stats();
    st.ring_fragments = skips.fragments;
    st.ring_skipped = skips.other;
    st.ring_bad_checksums = skips.bad_checksums;
    st.ring_drops = ring.drops;
    st.ring_freezes = ring.freezes;
    if let RxPath::Adaptive(a) = &path {
        st.adaptive_switches = Some(a.switches());
        st.adaptive_block = Some(a.active_block());
        st.adaptive_ring_frames = Some(a.ring_frames());
    }
    if let RxPath::Xdp(x) = &path {
        let xs = x.stats();
        let (redirected, passed) = x.counts();
        st.ring_drops = xs.rx_dropped + xs.rx_ring_full;
        st.xdp = Some(XdpReport {
            mode: x.xdp_mode().into(),
            zero_copy: x.zero_copy(),
            queues: x.queues(),
            redirected,
            passed,
            via_stack: x.via_stack,
            fill_ring_empty: xs.rx_fill_ring_empty,
            invalid_descs: xs.rx_invalid_descs,
        });
    }
    if let Some(p) = &paced {
        let report = p.report();
        st.datagrams_sent += report.sent;
        st.bytes_sent += p.bytes_sent();
        st.send_syscalls += report.sendmmsg_calls;
        st.send_errors += report.send_errors;
        st.paced = Some(report);
    }
    if let Some(r) = &raw {
        let report = r.report();
        st.send_syscalls += report.kicks;
        st.raw_tx = Some(report);
    }
    st.syscalls_per_response = if st.responses > 0 {
        (st.recv_syscalls + st.send_syscalls + st.polls) as f64 / st.responses as f64
    } else {
        0.0
    };
    Ok(st)
}

/// Lanes: one socket per receive queue in an `SO_REUSEPORT` group, the selector
/// steering by NAPI id, a thread per lane pinned to its queue's CPU. A lane that fails
/// stops the others (it gives `stop`).
fn serve_lanes(
    cfg: &ServerConfig,
    dev: &str,
    keys: &std::collections::hash_map::RandomState,
    stop: &Stop,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<ServerStats, ServerError> {
    let q = netlane::lanes::queues::lane_device(dev).map_err(ServerError::LaneDevice)?;
    let ids = q.napi_ids();
    let mut map = LaneMap::new(ids.len()).map_err(|e| ServerError::Lanes(e.to_string()))?;
    map.learn(&ids);
    let lanes: Vec<LaneId> = (0..ids.len()).map(|i| map.nth_lane(i)).collect();
    let cpu_of = |lane: LaneId| q.rx.iter().find(|r| map.owner(r.napi_id) == Some(lane)).and_then(|r| r.cpu);
    let cpus: Vec<Option<usize>> = lanes.iter().map(|&l| cpu_of(l)).collect();
    let owned: Vec<Vec<u32>> =
        lanes.iter().map(|&l| ids.iter().copied().filter(|&id| map.owner(id) == Some(l)).collect()).collect();
    // The group: sockets join in lane order, so socket i is lane i.
    let first = bind(cfg, cfg.listen, true)?;
    let local = first.local_addr().map_err(io_err("local address"))?;
    let mut steering = ReuseportSteering::load().map_err(io_err("load the reuseport selector (needs root)"))?;
    steering.attach(first.as_fd()).map_err(io_err("attach the reuseport selector"))?;
    let mut socks = vec![first];
    for _ in 1..lanes.len() {
        socks.push(bind(cfg, local, true)?);
    }
    for &l in &lanes {
        steering.joined(l);
    }
    steering.sync(&map).map_err(io_err("write the reuseport selector's map"))?;
    on_ready(local);
    let results: Vec<Result<ServerStats, ServerError>> = std::thread::scope(|s| {
        let handles: Vec<_> = socks
            .into_iter()
            .zip(&cpus)
            .map(|(sock, &cpu)| {
                let lane_cfg = ServerConfig { cpu, lane_device: None, ..cfg.clone() };
                s.spawn(move || {
                    let r = serve_on(&lane_cfg, sock, keys, stop, |_| {});
                    if r.is_err() {
                        stop.stop();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(ServerError::Lanes("a lane's thread panicked".into()))))
            .collect()
    });
    let mut per = Vec::with_capacity(results.len());
    for r in results {
        per.push(r?);
    }
    let (by_napi_id, by_hash) = steering.counts().map_err(io_err("read the reuseport selector's counters"))?;
    let mut st = ServerStats {
        path: cfg.path.to_string(),
        listen: local.to_string(),
        tx: cfg.tx.to_string(),
        ..ServerStats::default()
    };
    let mut report = LanesReport { device: dev.to_string(), lanes: Vec::new(), by_napi_id, by_hash };
    for (i, l) in per.iter().enumerate() {
        st.seconds = st.seconds.max(l.seconds);
        st.frames += l.frames;
        st.responses += l.responses;
        st.datagrams_sent += l.datagrams_sent;
        st.bytes_sent += l.bytes_sent;
        st.gso_sends += l.gso_sends;
        st.refused_malformed += l.refused_malformed;
        st.refused_not_request += l.refused_not_request;
        st.refused_too_large += l.refused_too_large;
        st.send_dropped += l.send_dropped;
        st.send_errors += l.send_errors;
        st.recv_errors += l.recv_errors;
        st.wakeups += l.wakeups;
        st.polls += l.polls;
        st.recv_syscalls += l.recv_syscalls;
        st.send_syscalls += l.send_syscalls;
        st.cpu_s += l.cpu_s;
        report.lanes.push(RrLane {
            lane: i,
            cpu: cpus[i],
            napi_ids: owned[i].clone(),
            frames: l.frames,
            responses: l.responses,
            cpu_s: l.cpu_s,
        });
    }
    let n = per.len().max(1) as f64;
    st.busy = if st.seconds > 0.0 { (st.cpu_s / (st.seconds * n)).min(1.0) } else { 0.0 };
    st.frames_per_wakeup = if st.wakeups > 0 { st.frames as f64 / st.wakeups as f64 } else { 0.0 };
    st.syscalls_per_response = if st.responses > 0 {
        (st.recv_syscalls + st.send_syscalls + st.polls) as f64 / st.responses as f64
    } else {
        0.0
    };
    st.lanes = Some(report);
    Ok(st)
}

/// The interface a ring path reads: the one named, or the one that has the listen
/// address (every interface when it is unspecified).
fn interface(cfg: &ServerConfig) -> Result<(u32, Option<String>), ServerError> {
    let name = match &cfg.iface {
        Some(n) => n.clone(),
        None if cfg.listen.ip().is_unspecified() => return Ok((0, Some("all".into()))),
        None => {
            let want = cfg.listen.ip();
            let addrs = nix::ifaddrs::getifaddrs().map_err(|e| io_err("getifaddrs")(e.into()))?;
            let found = addrs.into_iter().find(|a| {
                a.address.as_ref().is_some_and(|s| {
                    s.as_sockaddr_in().map(|v| std::net::IpAddr::V4(v.ip())) == Some(want)
                        || s.as_sockaddr_in6().map(|v| std::net::IpAddr::V6(v.ip())) == Some(want)
                })
            });
            match found {
                Some(a) => a.interface_name,
                None => {
                    return Err(ServerError::Interface(format!(
                        "no interface has {want}: name one for the {} path",
                        cfg.path
                    )));
                }
            }
        }
    };
    let index = nix::net::if_::if_nametoindex(name.as_str())
        .map_err(|e| ServerError::Interface(format!("interface {name}: {}", netlane::error::chain(&e))))?;
    Ok((index, Some(name)))
}

fn bind(cfg: &ServerConfig, addr: SocketAddr, reuseport: bool) -> Result<UdpSocket, ServerError> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM.cloexec(), Some(Protocol::UDP))
        .map_err(io_err("UDP socket"))?;
    if addr.is_ipv6() {
        s.set_only_v6(true).map_err(io_err("IPV6_V6ONLY"))?;
    }
    if reuseport {
        s.set_reuse_port(true).map_err(io_err("SO_REUSEPORT"))?;
    }
    // Buffers are best effort (capped by net.core.*mem_max); the stats show drops.
    let _ = s.set_recv_buffer_size(cfg.recv_buffer);
    let _ = s.set_send_buffer_size(cfg.send_buffer);
    s.bind(&SockAddr::from(addr)).map_err(io_err(format!("bind {addr}")))?;
    s.set_nonblocking(true).map_err(io_err("O_NONBLOCK"))?;
    Ok(s.into())
}

/// Epoll tokens: a descriptor frames arrive on, the service socket beside AF_XDP, and
/// the route and neighbour notifications of a frame transmit path.
const FRAMES: u64 = 0;
const STACK: u64 = 1;
const ROUTES: u64 = 2;
const PACE: u64 = 3;
const STOP: u64 = 4;

/// Sends the frames queued while answering a batch.
fn flush(raw: &mut Option<RawTx>, st: &mut ServerStats) {
    if let Some(r) = raw
        && let Err(e) = r.flush()
    {
        tracing::debug!(error = %e, "transmit ring flush failed");
        st.send_errors += 1;
    }
}

/// A receive error: whether to try again (EINTR) or stop draining. ICMP errors queued
/// on the socket (a client went away) surface here: counted, never fatal.
fn recv_error(e: io::Error, st: &mut ServerStats) -> bool {
    match e.kind() {
        io::ErrorKind::WouldBlock => false,
        io::ErrorKind::Interrupted => true,
        _ => {
            tracing::debug!(error = %e, "receive error");
            st.recv_errors += 1;
            false
        }
    }
}

/// Answers one request: the response, a Retry when the guard holds an unverified
/// source to less, a refusal when it asks for more than the server sends.
fn answer(
    cfg: &ServerConfig,
    senders: (&mut Tx<'_>, &mut Option<RawTx>, &mut Option<Paced>),
    guard: &mut Guard,
    out: &mut [u8],
    st: &mut ServerStats,
    request: &[u8],
    from: SocketAddr,
) {
    // Echo answers a datagram with itself: never larger than what came in.
    let result = if cfg.responder.echo {
        respond(&cfg.responder, request, out)
    } else {
        match wire::decode(request) {
            Err(e) => Err(Refusal::Malformed(e)),
            Ok((h, _)) if h.kind != Kind::Request => Err(Refusal::NotARequest),
            Ok((h, _)) => {
                let control = if h.response_len > cfg.responder.max_response {
                    st.refused_too_large += 1;
                    Some(Header::refused(&h, cfg.responder.max_response))
                } else {
                    let reply = cfg.responder.reply_bytes(h.response_len);
                    match guard.handle_request(from, h.offset, request.len(), reply, monotonic_ns()) {
                        Admit::Send { verified } => {
                            st.verified_requests += u64::from(verified);
                            None
                        }
                        Admit::Retry(cookie) => {
                            st.retries_sent += 1;
                            Some(Header::retry(&h, cookie))
                        }
                    }
                };
                if let Some(c) = control {
                    if let Ok(n) = wire::encode(&c, out) {
                        deliver(senders, &out[..n], 1, n, from, st);
                    }
                    return;
                }
                respond_to(&cfg.responder, &h, out)
            }
        }
    };
    match result {
        Ok(reply) => {
            st.responses += 1;
            deliver(senders, &out[..reply.len], reply.segments, reply.segment_len, from, st);
        }
        Err(Refusal::Malformed(_)) => st.refused_malformed += 1,
        Err(Refusal::NotARequest) => st.refused_not_request += 1,
        Err(Refusal::TooLarge { .. }) => st.refused_too_large += 1,
    }
}

/// Sends `reply` (`segments` datagrams of `segment_len` bytes) to `from`: paced, as
/// frames, or through the socket.
fn deliver(
    (tx, raw, paced): (&mut Tx<'_>, &mut Option<RawTx>, &mut Option<Paced>),
    reply: &[u8],
    segments: usize,
    segment_len: usize,
    from: SocketAddr,
    st: &mut ServerStats,
) {
    if let Some(p) = paced {
        if !p.push(reply, from) {
            st.send_dropped += 1;
        }
        return;
    }
    if let Some(r) = raw {
        match r.send(reply, segment_len, from) {
            Ok(Sent::Frames) => {
                st.datagrams_sent += segments as u64;
                st.bytes_sent += reply.len() as u64;
                return;
            }
            Ok(Sent::Dropped) => {
                st.send_dropped += 1;
                return;
            }
            Ok(Sent::UseSocket) => {}
            Err(e) => {
                tracing::debug!(error = %e, %from, "frame transmit failed");
                st.send_errors += 1;
                return;
            }
        }
    }
    match tx.send(reply, segment_len, from) {
        Ok(()) => {
            st.datagrams_sent += segments as u64;
            st.bytes_sent += reply.len() as u64;
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => st.send_dropped += 1,
        Err(e) => {
            tracing::debug!(error = %e, %from, "send failed");
            st.send_errors += 1;
        }
    }
}

/// Sends responses through the service's UDP socket: one datagram with `sendto`,
/// segments with GSO (`UDP_SEGMENT`, up to 64 per call), falling back to one `sendto`
/// per segment when the kernel refuses GSO.
struct Tx<'a> {
    sock: &'a UdpSocket,
    gso: bool,
    syscalls: u64,
    gso_sends: u64,
}

impl<'a> Tx<'a> {
    fn new(sock: &'a UdpSocket) -> Self {
        Tx { sock, gso: true, syscalls: 0, gso_sends: 0 }
    }

    fn send(&mut self, data: &[u8], segment_len: usize, to: SocketAddr) -> io::Result<()> {
        if data.len() <= segment_len {
            return self.send_one(data, to);
        }
        if self.gso {
            let dst = SockAddr::from(to);
            let mut sent = 0;
            for batch in data.chunks(segment_len * UDP_MAX_SEGMENTS) {
                if batch.len() <= segment_len {
                    self.send_one(batch, to)?;
                    sent += batch.len();
                    continue;
                }
                let mut cmsg = CmsgBuf::<32>::new();
                cmsg.push_udp_segment(segment_len as u16).map_err(|_| io::Error::other("control buffer full"))?;
                match self.retry(|s| {
                    netlane_sys::msg::sendmsg(s.as_fd(), Some(&dst), &[IoSlice::new(batch)], cmsg.as_bytes(), 0)
                }) {
                    Ok(_) => {
                        self.gso_sends += 1;
                        sent += batch.len();
                    }
                    // EIO (no checksum offload), EINVAL/EMSGSIZE: send the rest one by one
                    // from now on.
                    Err(e)
                        if sent == 0 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE)) =>
                    {
                        tracing::warn!(error = %e, "GSO refused; sending segments one by one");
                        self.gso = false;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if self.gso {
                return Ok(());
            }
        }
        for seg in data.chunks(segment_len) {
            self.send_one(seg, to)?;
        }
        Ok(())
    }

    fn send_one(&mut self, data: &[u8], to: SocketAddr) -> io::Result<()> {
        self.retry(|s| s.send_to(data, to)).map(|_| ())
    }

    /// Runs a send; while the socket buffer is full waits for room (up to a second in
    /// all), so a burst of responses is slowed, not dropped.
    fn retry(&mut self, mut f: impl FnMut(&UdpSocket) -> io::Result<usize>) -> io::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            self.syscalls += 1;
            match f(self.sock) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    let mut fds = [nix::poll::PollFd::new(self.sock.as_fd(), nix::poll::PollFlags::POLLOUT)];
                    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10u8));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }
}
