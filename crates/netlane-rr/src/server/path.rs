//! The receive paths: how requests get from the kernel to the server thread.

use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::str::FromStr;

use netlane_sys::msg::RecvBatch;
use netlane_sys::packet::{Insn, PacketRing, PacketStats, RingSpec, attach_filter, page_size};

use crate::proto::packet::{Skip, parse_frame, udp_port_filter};

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
        !matches!(self, PathKind::AfXdp)
    }

    /// Whether the path reads frames from a packet ring (and so needs an interface).
    pub fn is_ring(self) -> bool {
        matches!(self, PathKind::TpacketV2 | PathKind::TpacketV3)
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
}

impl Default for RingOptions {
    fn default() -> Self {
        RingOptions { frame_size: 2048, frames: 4096, frames_per_block: 32, blocks: 64, retire_ms: 8 }
    }
}

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

/// Frames a ring path skipped, by reason (the filter lets only the service's port in,
/// so these are fragments and oddities).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingSkips {
    /// IP fragments (a ring sees them unassembled).
    pub fragments: u64,
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
    /// A packet ring.
    Ring {
        /// The ring.
        ring: PacketRing,
        /// The service's port.
        port: u16,
        /// What it skipped.
        skips: RingSkips,
    },
}

/// Room for any UDP datagram.
const SLOT: usize = 65_536;

/// ETH_P_ALL: every protocol (the filter picks).
const ETH_P_ALL: u16 = 0x0003;

impl RxPath {
    /// Sets up `kind` for the service socket `sock`; a ring path binds to interface
    /// `ifindex` (0: all).
    pub fn new(kind: PathKind, sock: &UdpSocket, batch: usize, ring: &RingOptions, ifindex: u32) -> io::Result<RxPath> {
        match kind {
            PathKind::Recvfrom => Ok(RxPath::Recvfrom { buf: vec![0; SLOT] }),
            PathKind::Recvmmsg => Ok(RxPath::Recvmmsg(RecvBatch::new(batch, SLOT, 0, true))),
            PathKind::TpacketV2 | PathKind::TpacketV3 => {
                let spec = ring.spec(kind).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let port = sock.local_addr()?.port();
                let filter: Vec<Insn> =
                    udp_port_filter(port).iter().map(|i| Insn { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect();
                let ring = PacketRing::open(ETH_P_ALL, ifindex, &filter, spec)?;
                // The service socket stays bound (so the port never answers with ICMP
                // unreachable) but reads nothing: a filter that drops every datagram
                // keeps it from queueing a second copy of each request.
                let drop_all = [Insn { code: 0x06, jt: 0, jf: 0, k: 0 }];
                attach_filter(sock.as_fd(), &drop_all)?;
                Ok(RxPath::Ring { ring, port, skips: RingSkips::default() })
            }
            other => Err(io::Error::new(io::ErrorKind::Unsupported, format!("{other} is not available yet"))),
        }
    }

    /// The descriptor to wait on.
    pub fn fd<'a>(&'a self, sock: &'a UdpSocket) -> BorrowedFd<'a> {
        match self {
            RxPath::Ring { ring, .. } => ring.as_fd(),
            _ => sock.as_fd(),
        }
    }

    /// What a ring path skipped so far.
    pub fn skips(&self) -> RingSkips {
        match self {
            RxPath::Ring { skips, .. } => *skips,
            _ => RingSkips::default(),
        }
    }

    /// The ring's drop and freeze counters since the last call (zero for socket paths).
    pub fn take_ring_stats(&self) -> PacketStats {
        match self {
            RxPath::Ring { ring, .. } => ring.take_stats().unwrap_or_default(),
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
            RxPath::Ring { ring, port, skips } => {
                let port = *port;
                // The UDP checksum is not checked here (on veth and loopback the kernel
                // often leaves it unfinished: TP_STATUS_CSUMNOTREADY); every request
                // carries its own CRC32C, which the protocol core checks.
                let n = ring.drain(&mut |frame, _csum_not_ready| match parse_frame(frame, port) {
                    Ok(u) => f(u.payload, u.src),
                    Err(Skip::Fragment) => skips.fragments += 1,
                    Err(_) => skips.other += 1,
                });
                if n == 0 { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
            }
        }
    }
}
