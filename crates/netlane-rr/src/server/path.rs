//! The receive paths: how requests get from the kernel to the server thread.

use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::str::FromStr;

use netlane_sys::bpf::{RingSelect, XdpLink, XskDst, XskRedirect};
use netlane_sys::msg::RecvBatch;
use netlane_sys::packet::{BlockCounts, Insn, PacketRing, PacketStats, RingSpec, attach_filter, page_size};
use netlane_sys::xsk::{Xsk, XskConfig, XskMode, XskStats};

use crate::proto::adapt::{BlockChooser, WindowCounts};
use crate::proto::packet::{AddrMatch, Csum, FrameMeta, ServiceAddr, Skip, parse_frame, udp_service_filter};

/// A receive path, selectable at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathKind {
    /// `recvfrom` until `EAGAIN`, then `epoll_wait` (netserver's loop).
    Recvfrom,
    /// `recvmmsg` batches.
    Recvmmsg,
    /// A PF_PACKET TPACKET_V2 receive ring.
    TpacketV2,
    /// A PF_PACKET TPACKET_V3 receive ring (woken per block).
    TpacketV3,
    /// An AF_XDP socket per receive queue.
    AfXdp,
}

impl PathKind {
    /// Every path, in the order reports list them.
    pub const ALL: [PathKind; 5] =
        [PathKind::Recvfrom, PathKind::Recvmmsg, PathKind::TpacketV2, PathKind::TpacketV3, PathKind::AfXdp];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Recvfrom => "recvfrom",
            PathKind::Recvmmsg => "recvmmsg",
            PathKind::TpacketV2 => "tpacket-v2",
            PathKind::TpacketV3 => "tpacket-v3",
            PathKind::AfXdp => "af-xdp",
        }
    }

    /// Whether this build has the path.
    pub fn available(self) -> bool {
        true
    }

    /// Whether the path reads frames from a packet ring (TPACKET).
    pub fn is_ring(self) -> bool {
        matches!(self, PathKind::TpacketV2 | PathKind::TpacketV3)
    }

    /// Whether the path reads frames below the stack (and so needs an interface).
    pub fn is_frames(self) -> bool {
        self.is_ring() || self == PathKind::AfXdp
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PathKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        PathKind::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = PathKind::ALL.iter().map(|p| p.name()).collect();
            format!("unknown receive path {s:?}: expected one of {}", names.join(", "))
        })
    }
}

/// Packet ring geometry (the ring paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOptions {
    /// Bytes per frame slot (TPACKET_V2: every frame; V3: the accounting unit).
    pub frame_size: u32,
    /// TPACKET_V2: frames in the ring.
    pub frames: u32,
    /// TPACKET_V3: frames per block (the block is `frames_per_block * frame_size`).
    pub frames_per_block: u32,
    /// TPACKET_V3: blocks in the ring.
    pub blocks: u32,
    /// TPACKET_V3: milliseconds after which a partly filled block is handed over.
    pub retire_ms: u32,
    /// TPACKET_V3: keep rings of 4 to 128 KiB blocks and move the traffic to the
    /// largest block that keeps the request rate, at most half the burst (see
    /// `proto::adapt`); `frames_per_block` is then unused.
    pub adaptive: bool,
}

impl Default for RingOptions {
    fn default() -> Self {
        RingOptions { frame_size: 2048, frames: 4096, frames_per_block: 32, blocks: 64, retire_ms: 8, adaptive: false }
    }
}

/// Block sizes of the adaptive mode's rings.
pub const ADAPTIVE_BLOCKS: [u32; 10] = [4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536, 98304, 131072];
/// Blocks per ring in the adaptive mode.
const ADAPTIVE_RING_BLOCKS: u32 = 32;
/// How often the adaptive mode decides.
const ADAPTIVE_WINDOW_NS: u64 = 50_000_000;

/// The largest ring the server maps.
pub const MAX_RING_BYTES: usize = 256 << 20;

impl RingOptions {
    /// The ring for `kind`, checked: frames that fit their blocks, blocks that are whole
    /// pages, and a bounded size.
    pub fn spec(&self, kind: PathKind) -> Result<RingSpec, String> {
        let page = page_size() as u32;
        if self.frame_size < 128 || !self.frame_size.is_multiple_of(16) {
            return Err(format!("frame size {}: a multiple of 16, at least 128", self.frame_size));
        }
        let spec = match kind {
            PathKind::TpacketV2 => {
                if self.frames == 0 {
                    return Err("a TPACKET_V2 ring needs at least one frame".into());
                }
                let block = self.frame_size.div_ceil(page) * page;
                RingSpec::V2 { block_size: block, frame_size: self.frame_size, frames: self.frames }
            }
            PathKind::TpacketV3 if self.adaptive => {
                let largest = *ADAPTIVE_BLOCKS.last().unwrap_or(&131_072);
                RingSpec::V3 {
                    block_size: largest,
                    blocks: ADAPTIVE_RING_BLOCKS * ADAPTIVE_BLOCKS.len() as u32,
                    frame_size: self.frame_size.min(largest),
                    retire_ms: self.retire_ms,
                }
            }
            _ => {
                let block = u64::from(self.frames_per_block) * u64::from(self.frame_size);
                if self.frames_per_block == 0 || !block.is_multiple_of(u64::from(page)) || block > 1 << 30 {
                    return Err(format!(
                        "{} frames per block of {} bytes make a {block}-byte block: it must be a whole number of \
                         {page}-byte pages",
                        self.frames_per_block, self.frame_size
                    ));
                }
                if self.blocks == 0 {
                    return Err("a TPACKET_V3 ring needs at least one block".into());
                }
                RingSpec::V3 {
                    block_size: block as u32,
                    blocks: self.blocks,
                    frame_size: self.frame_size,
                    retire_ms: self.retire_ms,
                }
            }
        };
        if spec.bytes() > MAX_RING_BYTES {
            return Err(format!("a {}-byte ring: at most {MAX_RING_BYTES}", spec.bytes()));
        }
        Ok(spec)
    }
}

/// AF_XDP sizes (per receive queue: each queue has its own socket and UMEM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpOptions {
    /// Bytes per UMEM frame (2048 or 4096).
    pub frame_size: u32,
    /// UMEM frames per queue.
    pub frames: u32,
    /// RX and fill ring entries (a power of two).
    pub ring_size: u32,
    /// Try zero-copy first (falls back to copy mode when the driver refuses).
    pub zero_copy: bool,
    /// Keep half the UMEM frames of the first queue's socket for its TX ring (the
    /// server sets this for `--tx af-xdp`).
    pub transmit: bool,
}

impl Default for XdpOptions {
    fn default() -> Self {
        // 1 MiB of UMEM per queue: four queues fit an 8 MiB RLIMIT_MEMLOCK.
        XdpOptions { frame_size: 2048, frames: 512, ring_size: 512, zero_copy: true, transmit: false }
    }
}

impl XdpOptions {
    /// Checks the sizes, and that `queues` UMEMs fit the locked-memory limit `memlock`
    /// (bytes; None: unlimited).
    pub fn check(&self, queues: u32, memlock: Option<u64>) -> Result<XskConfig, String> {
        if !matches!(self.frame_size, 2048 | 4096) {
            return Err(format!("AF_XDP frame size {}: 2048 or 4096", self.frame_size));
        }
        if !self.ring_size.is_power_of_two() || !(64..=16_384).contains(&self.ring_size) {
            return Err(format!("AF_XDP ring size {}: a power of two, 64..=16384", self.ring_size));
        }
        if self.frames < self.ring_size {
            return Err(format!("{} UMEM frames cannot fill a {}-entry fill ring", self.frames, self.ring_size));
        }
        let cfg =
            XskConfig { frame_size: self.frame_size, frames: self.frames, ring_size: self.ring_size, tx_frames: 0 };
        if self.transmit && self.frames < 128 {
            return Err(format!("{} UMEM frames: transmitting needs 128 at least (half for each way)", self.frames));
        }
        let total = cfg.umem_bytes() as u64 * u64::from(queues);
        if let Some(limit) = memlock
            && total > limit
        {
            return Err(format!(
                "{queues} queues x {} frames x {} bytes = {total} bytes of UMEM, over the {limit}-byte locked-memory \
                 limit (RLIMIT_MEMLOCK): use fewer frames",
                self.frames, self.frame_size
            ));
        }
        Ok(cfg)
    }
}

/// Frames a ring path skipped, by reason (the filter lets only the service's datagrams
/// in, so these are fragments and oddities).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingSkips {
    /// IP fragments (a ring sees them unassembled).
    pub fragments: u64,
    /// A wrong IPv4 header or UDP checksum: the stack would have dropped them.
    pub bad_checksums: u64,
    /// Anything else that was not a whole UDP datagram for the service.
    pub other: u64,
}

/// A receive path, set up.
#[derive(Debug)]
pub enum RxPath {
    /// One `recvfrom` per datagram.
    Recvfrom {
        /// Room for the largest datagram.
        buf: Vec<u8>,
    },
    /// `recvmmsg` into a batch of slots.
    Recvmmsg(RecvBatch),
    /// AF_XDP sockets, one per receive queue, behind the steering program; the
    /// service socket still answers what the program passes to the stack (IP
    /// fragments, reassembled there).
    Xdp(Box<XdpPath>),
    /// TPACKET_V3 rings of several block sizes, one taking the traffic at a time.
    Adaptive(Box<AdaptivePath>),
    /// A packet ring.
    Ring {
        /// The ring.
        ring: PacketRing,
        /// The datagrams that are the service's.
        want: ServiceAddr,
        /// What it skipped.
        skips: RingSkips,
    },
}

/// The adaptive TPACKET_V3 path's parts: rings of several block sizes in one packet
/// fanout group, whose program hands each frame to the active ring only. (Idle rings
/// behind a drop-everything filter cost a delivery per ring and frame in the receive
/// softirq: with ten rings, the server CPU spent more per request than on one fixed
/// ring.)
#[derive(Debug)]
pub struct AdaptivePath {
    rings: Vec<PacketRing>,
    select: RingSelect,
    chooser: BlockChooser,
    /// The active ring's block counts when the current window began.
    base: BlockCounts,
    want: ServiceAddr,
    skips: RingSkips,
    started: std::time::Instant,
}

impl AdaptivePath {
    /// Ring switches so far.
    pub fn switches(&self) -> u64 {
        self.chooser.switches()
    }

    /// Block bytes of the ring in use.
    pub fn active_block(&self) -> u32 {
        ADAPTIVE_BLOCKS[self.chooser.active()]
    }

    /// Frames each ring delivered so far, in [`ADAPTIVE_BLOCKS`] order.
    pub fn ring_frames(&self) -> Vec<u64> {
        self.rings.iter().map(|r| r.block_counts().frames).collect()
    }

    fn drain(&mut self, f: &mut dyn FnMut(&[u8], SocketAddr)) -> io::Result<usize> {
        let want = self.want;
        let mut n = 0;
        let (chooser, skips) = (&mut self.chooser, &mut self.skips);
        for ring in &mut self.rings {
            n += ring.drain(&mut |frame, status| match parse_frame(frame, want, ring_meta(status)) {
                Ok(u) => {
                    chooser.on_frame(u.src, frame.len());
                    f(u.payload, u.src);
                }
                Err(e) => skips.count(e),
            });
        }
        let now = self.started.elapsed().as_nanos() as u64;
        let old = self.chooser.active();
        let c = self.rings[old].block_counts();
        let window = WindowCounts { full: c.full - self.base.full, timed_out: c.timed_out - self.base.timed_out };
        let next = self.chooser.tick(now, window);
        if let Some(next) = next {
            tracing::debug!(from = ADAPTIVE_BLOCKS[old], to = ADAPTIVE_BLOCKS[next], rates = ?self.chooser.rates(), "adaptive ring switch");
            // Frames from now on go to the new ring; what the old ring holds in its
            // open block is handed over when the block retires (by its timer at the
            // latest) and drained like the rest: nothing is lost or duplicated.
            self.select.select(next as u32);
            self.base = self.rings[next].block_counts();
        } else if self.chooser.window_ended(now) {
            self.base = c;
        }
        Ok(n)
    }
}

/// The AF_XDP path's parts.
#[derive(Debug)]
pub struct XdpPath {
    socks: Vec<Xsk>,
    // Declared after the sockets: the program detaches (link dropped) after the sockets
    // close, and before the program object goes.
    link: XdpLink,
    prog: XskRedirect,
    want: ServiceAddr,
    skips: RingSkips,
    buf: Vec<u8>,
    /// Datagrams that came through the stack instead (fragments).
    pub via_stack: u64,
    ifindex: u32,
}

impl XdpPath {
    /// "native" or "generic".
    pub fn xdp_mode(&self) -> &'static str {
        self.link.mode().name()
    }

    /// Whether the sockets are zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.socks.iter().all(|s| s.mode() == XskMode::ZeroCopy)
    }

    /// Queues with a socket.
    pub fn queues(&self) -> usize {
        self.socks.len()
    }

    /// The program's counts: redirected to a socket, passed to the stack.
    pub fn counts(&self) -> (u64, u64) {
        self.prog.counts().unwrap_or_default()
    }

    /// The first socket's transmit half (with [`XdpOptions::transmit`]), once.
    pub fn take_tx(&mut self) -> Option<netlane_sys::xsk::XskTx> {
        self.socks.first_mut().and_then(Xsk::take_tx)
    }

    /// The interface the sockets are bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The sockets' drop counters, summed.
    pub fn stats(&self) -> XskStats {
        let mut t = XskStats::default();
        for s in &self.socks {
            if let Ok(x) = s.stats() {
                t.rx_dropped += x.rx_dropped;
                t.rx_invalid_descs += x.rx_invalid_descs;
                t.rx_ring_full += x.rx_ring_full;
                t.rx_fill_ring_empty += x.rx_fill_ring_empty;
            }
        }
        t
    }
}

/// Receive queues of interface `name` (from sysfs; 1 when it says nothing).
pub fn rx_queues(name: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("rx-")).count() as u32)
        .unwrap_or(1)
        .max(1)
}

impl RingSkips {
    fn count(&mut self, why: Skip) {
        match why {
            Skip::Fragment => self.fragments += 1,
            Skip::BadChecksum => self.bad_checksums += 1,
            _ => self.other += 1,
        }
    }
}

/// What a packet ring's frame header says, in the parser's terms.
fn ring_meta(s: netlane_sys::packet::FrameStatus) -> FrameMeta {
    let csum = if s.csum_valid {
        Csum::Verified
    } else if s.csum_not_ready {
        Csum::Partial
    } else {
        Csum::Unknown
    };
    FrameMeta { csum, vlan_tci: s.vlan_tci }
}

/// The locked-memory limit in bytes (None: unlimited).
pub fn memlock_limit() -> Option<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

/// The datagrams the service socket `sock` receives: all a path below the stack may
/// take (more would take other sockets' datagrams on the same port).
fn service_of(sock: &UdpSocket) -> io::Result<ServiceAddr> {
    let local = sock.local_addr()?;
    let v6only = local.is_ipv6() && socket2::SockRef::from(sock).only_v6()?;
    Ok(ServiceAddr::of_socket(local, v6only))
}

/// The kernel's form of [`udp_service_filter`] for `want`.
fn ring_filter(want: ServiceAddr) -> Vec<Insn> {
    udp_service_filter(want).iter().map(|i| Insn { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect()
}

/// The steering program's form of an [`AddrMatch`] (the sans-IO core does not know the
/// BPF crate's types).
fn xsk_dst<A>(m: AddrMatch<A>) -> XskDst<A> {
    match m {
        AddrMatch::No => XskDst::No,
        AddrMatch::Any => XskDst::Any,
        AddrMatch::Only(a) => XskDst::Only(a),
    }
}

/// Room for any UDP datagram.
const SLOT: usize = 65_536;

/// ETH_P_ALL: every protocol (the filter picks).
const ETH_P_ALL: u16 = 0x0003;

impl RxPath {
    /// Sets up `kind` for the service socket `sock`; a ring path binds to interface
    /// `ifindex` (0: all).
    pub fn new(
        kind: PathKind,
        sock: &UdpSocket,
        batch: usize,
        ring: &RingOptions,
        xdp: &XdpOptions,
        iface: (u32, &str),
    ) -> io::Result<RxPath> {
        let ifindex = iface.0;
        match kind {
            PathKind::Recvfrom => Ok(RxPath::Recvfrom { buf: vec![0; SLOT] }),
            PathKind::Recvmmsg => Ok(RxPath::Recvmmsg(RecvBatch::new(batch, SLOT, 0, true))),
            PathKind::TpacketV3 if ring.adaptive => {
                let want = service_of(sock)?;
                let pass = ring_filter(want);
                let drop_all = [Insn { code: 0x06, jt: 0, jf: 0, k: 0 }];
                // The group must leave out what this host sends (6.2's fanout flag; older
                // kernels ignore it and each request on loopback would come twice).
                if netlane::probe::kernel_version().is_none_or(|v| v < (6, 2)) {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "the adaptive TPACKET_V3 mode needs Linux 6.2 or later (PACKET_FANOUT_FLAG_IGNORE_OUTGOING)",
                    ));
                }
                // The smallest block takes the traffic first (member 0).
                let select =
                    RingSelect::load().map_err(|e| io::Error::new(e.kind(), format!("load the ring selector: {e}")))?;
                let mut rings: Vec<PacketRing> = Vec::new();
                let mut group = None;
                for block in ADAPTIVE_BLOCKS {
                    let spec = RingSpec::V3 {
                        block_size: block,
                        blocks: ADAPTIVE_RING_BLOCKS,
                        frame_size: ring.frame_size.min(block),
                        retire_ms: ring.retire_ms,
                    };
                    // Bound with a filter that takes nothing: until it joins the group
                    // a socket gets frames of its own (duplicates of member 0's).
                    let r = PacketRing::open(ETH_P_ALL, ifindex, &drop_all, spec)?;
                    // Joined in ascending order: member i is ADAPTIVE_BLOCKS[i]. The
                    // program is set when the group exists, before the second member
                    // joins; until then member 0 takes everything anyway.
                    let id = r
                        .join_fanout(group)
                        .map_err(|e| io::Error::new(e.kind(), format!("packet fanout group: {e}")))?;
                    if group.is_none() {
                        r.set_fanout_program(select.prog_fd())?;
                        group = Some(id);
                    }
                    r.set_filter(&pass)?;
                    rings.push(r);
                }
                attach_filter(sock.as_fd(), &drop_all)?;
                Ok(RxPath::Adaptive(Box::new(AdaptivePath {
                    rings,
                    select,
                    chooser: BlockChooser::new(ADAPTIVE_BLOCKS.to_vec(), ADAPTIVE_WINDOW_NS),
                    base: BlockCounts::default(),
                    want,
                    skips: RingSkips::default(),
                    started: std::time::Instant::now(),
                })))
            }
            PathKind::TpacketV2 | PathKind::TpacketV3 => {
                let spec = ring.spec(kind).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let want = service_of(sock)?;
                let ring = PacketRing::open(ETH_P_ALL, ifindex, &ring_filter(want), spec)?;
                // The service socket stays bound (so the port never answers with ICMP
                // unreachable) but reads nothing: a filter that drops every datagram
                // keeps it from queueing a second copy of each request.
                let drop_all = [Insn { code: 0x06, jt: 0, jf: 0, k: 0 }];
                attach_filter(sock.as_fd(), &drop_all)?;
                Ok(RxPath::Ring { ring, want, skips: RingSkips::default() })
            }
            PathKind::AfXdp => {
                if ifindex == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "AF_XDP binds to one interface's queues: listen on an interface's address or name one",
                    ));
                }
                let queues = rx_queues(iface.1).min(netlane_sys::bpf::XSK_MAX_QUEUES);
                let cfg =
                    xdp.check(queues, memlock_limit()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let want = service_of(sock)?;
                // Unicast frames for another MAC (promiscuous mode) are not the service's.
                let mac = netlane::topology::Rtnl::open()
                    .and_then(|mut r| r.link_mac(ifindex).map_err(io::Error::other))
                    .map_err(|e| io::Error::new(e.kind(), format!("the MAC of {}: {e}", iface.1)))?;
                let own_mac = <[u8; 6]>::try_from(mac.as_slice()).ok();
                let prog = XskRedirect::load(want.port, xsk_dst(want.v4), xsk_dst(want.v6), own_mac)?;
                let mut socks = Vec::new();
                for q in 0..queues {
                    // The first queue's socket also transmits: half its frames for TX.
                    // (At most the completion ring's size: the kernel needs a completion slot
                    // per frame in flight.)
                    let tx_frames = (cfg.frames / 2).min(cfg.ring_size);
                    let cfg = if q == 0 && xdp.transmit { XskConfig { tx_frames, ..cfg } } else { cfg };
                    let open = || {
                        if xdp.zero_copy {
                            Xsk::open(ifindex, q, cfg, XskMode::ZeroCopy)
                                .or_else(|_| Xsk::open(ifindex, q, cfg, XskMode::Copy))
                        } else {
                            Xsk::open(ifindex, q, cfg, XskMode::Copy)
                        }
                    };
                    // A socket just closed on this queue is released by the kernel a
                    // moment later (after an RCU grace period): EBUSY for a while.
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                    let s = loop {
                        match open() {
                            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline => {
                                std::thread::sleep(std::time::Duration::from_millis(50));
                            }
                            r => break r,
                        }
                    };
                    let s = s.map_err(|e| {
                        let why = if e.raw_os_error() == Some(libc::EBUSY) {
                            " (another AF_XDP socket is bound to it)"
                        } else {
                            ""
                        };
                        io::Error::new(e.kind(), format!("AF_XDP socket on queue {q} of {}{why}: {e}", iface.1))
                    })?;
                    prog.register(q, s.as_fd())?;
                    socks.push(s);
                }
                let (link, _) = XdpLink::attach_native_or_generic(prog.prog_fd(), ifindex).map_err(|e| {
                    io::Error::new(e.kind(), format!("attach the steering program to {}: {e}", iface.1))
                })?;
                Ok(RxPath::Xdp(Box::new(XdpPath {
                    socks,
                    link,
                    prog,
                    want,
                    skips: RingSkips::default(),
                    buf: vec![0; SLOT],
                    via_stack: 0,
                    ifindex,
                })))
            }
        }
    }

    /// The descriptors the frames arrive on (the service socket for the socket paths).
    pub fn fds<'a>(&'a self, sock: &'a UdpSocket) -> Vec<BorrowedFd<'a>> {
        match self {
            RxPath::Ring { ring, .. } => vec![ring.as_fd()],
            RxPath::Adaptive(a) => a.rings.iter().map(AsFd::as_fd).collect(),
            RxPath::Xdp(x) => x.socks.iter().map(AsFd::as_fd).collect(),
            _ => vec![sock.as_fd()],
        }
    }

    /// What a ring or AF_XDP path skipped so far.
    pub fn skips(&self) -> RingSkips {
        match self {
            RxPath::Ring { skips, .. } => *skips,
            RxPath::Adaptive(a) => a.skips,
            RxPath::Xdp(x) => x.skips,
            _ => RingSkips::default(),
        }
    }

    /// The ring's drop and freeze counters since the last call (zero for socket paths).
    pub fn take_ring_stats(&self) -> PacketStats {
        match self {
            RxPath::Ring { ring, .. } => ring.take_stats().unwrap_or_default(),
            RxPath::Adaptive(a) => {
                a.rings.iter().filter_map(|r| r.take_stats().ok()).fold(PacketStats::default(), |t, s| PacketStats {
                    packets: t.packets + s.packets,
                    drops: t.drops + s.drops,
                    freezes: t.freezes + s.freezes,
                })
            }
            _ => PacketStats::default(),
        }
    }

    /// One receive call: hands each datagram and its sender to `f`; returns how many
    /// frames it looked at (a ring: every ready frame). `WouldBlock` when there was
    /// nothing.
    pub fn recv(&mut self, sock: &UdpSocket, f: &mut dyn FnMut(&[u8], SocketAddr)) -> io::Result<usize> {
        match self {
            RxPath::Recvfrom { buf } => {
                let (n, from) = sock.recv_from(buf)?;
                f(&buf[..n], from);
                Ok(1)
            }
            RxPath::Recvmmsg(batch) => {
                let n = batch.recv_many(sock.as_fd(), batch.slots(), libc::MSG_DONTWAIT)?;
                for i in 0..n {
                    // A datagram without a source cannot be answered (an unnamed
                    // socket's); it is not a request anyone waits for.
                    if let Some(from) = batch.source(i) {
                        f(batch.data(i), from);
                    }
                }
                Ok(n)
            }
            RxPath::Ring { ring, want, skips } => {
                let want = *want;
                let n = ring.drain(&mut |frame, status| match parse_frame(frame, want, ring_meta(status)) {
                    Ok(u) => f(u.payload, u.src),
                    Err(e) => skips.count(e),
                });
                if n == 0 { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
            }
            RxPath::Adaptive(a) => {
                let n = a.drain(f)?;
                if n == 0 { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
            }
            RxPath::Xdp(x) => {
                let want = x.want;
                let mut n = 0;
                let skips = &mut x.skips;
                for s in &mut x.socks {
                    // AF_XDP reports no checksum state: a local sender's unfinished
                    // checksum cannot be told from a finished one.
                    let meta = FrameMeta { csum: Csum::UnknownOrPartial, vlan_tci: None };
                    n += s.drain(&mut |frame| match parse_frame(frame, want, meta) {
                        Ok(u) => f(u.payload, u.src),
                        Err(e) => skips.count(e),
                    });
                    if s.fill_needs_wakeup() {
                        s.wakeup()?;
                    }
                }
                if n == 0 { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
            }
        }
    }

    /// Whether the service socket also carries requests (AF_XDP: what the program
    /// passes to the stack, IP fragments reassembled there), to be waited on beside
    /// [`RxPath::fds`].
    pub fn reads_stack_too(&self) -> bool {
        matches!(self, RxPath::Xdp(_))
    }

    /// One `recvfrom` on the service socket for what came through the stack (AF_XDP);
    /// `WouldBlock` when there was nothing.
    pub fn recv_stack(&mut self, sock: &UdpSocket, f: &mut dyn FnMut(&[u8], SocketAddr)) -> io::Result<usize> {
        let RxPath::Xdp(x) = self else { return Err(io::ErrorKind::WouldBlock.into()) };
        let (len, from) = sock.recv_from(&mut x.buf)?;
        x.via_stack += 1;
        f(&x.buf[..len], from);
        Ok(1)
    }
}
