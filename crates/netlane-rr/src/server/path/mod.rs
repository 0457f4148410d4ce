//! The receive paths: how requests get from the kernel to the server thread.
//!
//! Files: this one the paths by name ([`PathKind`]) and a path set up ([`RxPath`]), with
//! the socket paths; `ring.rs` the packet rings (one ring, or the adaptive mode's
//! several), `xdp.rs` AF_XDP.

mod ring;
mod xdp;

use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::str::FromStr;

use netlane_sys::msg::RecvBatch;
use netlane_sys::packet::{PacketRing, PacketStats};

use crate::proto::packet::{Csum, FrameMeta, ServiceAddr, Skip, parse_frame};
use crate::proto::reasm::ReasmCounters;

pub use ring::{ADAPTIVE_BLOCKS, MAX_RING_BYTES, RingOptions};
pub use xdp::{XdpOptions, memlock_limit, rx_queues};

use ring::{AdaptivePath, RingTaker, ring_meta};
use xdp::XdpPath;

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

/// Frames a ring path skipped, by reason (the filter lets only the service's datagrams
/// in, so these are fragments and oddities), and what became of the fragments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingSkips {
    /// IP fragments (a ring sees them unassembled and reassembles them).
    pub fragments: u64,
    /// The reassembler's counts (ring paths).
    pub reasm: ReasmCounters,
    /// A wrong IPv4 header or UDP checksum: the stack would have dropped them.
    pub bad_checksums: u64,
    /// Anything else that was not a whole UDP datagram for the service.
    pub other: u64,
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
        /// What becomes of its frames.
        taker: Box<RingTaker>,
    },
}

/// The datagrams the service socket `sock` receives: all a path below the stack may
/// take (more would take other sockets' datagrams on the same port).
fn service_of(sock: &UdpSocket) -> io::Result<ServiceAddr> {
    let local = sock.local_addr()?;
    let v6only = local.is_ipv6() && socket2::SockRef::from(sock).only_v6()?;
    Ok(ServiceAddr::of_socket(local, v6only))
}

/// Room for any UDP datagram.
const SLOT: usize = 65_536;

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
            PathKind::TpacketV3 if ring.adaptive => RxPath::open_adaptive(sock, ring, ifindex),
            PathKind::TpacketV2 | PathKind::TpacketV3 => RxPath::open_ring(kind, sock, ring, ifindex),
            PathKind::AfXdp => RxPath::open_xdp(sock, xdp, iface),
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

    /// Time passes with nothing to read: a ring path gives up the fragmented datagrams
    /// whose time ran out (otherwise looked for when frames come).
    pub fn tick(&mut self) {
        match self {
            RxPath::Ring { taker, .. } => _ = taker.now(),
            RxPath::Adaptive(a) => _ = a.taker.now(),
            _ => {}
        }
    }

    /// What a ring or AF_XDP path skipped so far.
    pub fn skips(&self) -> RingSkips {
        match self {
            RxPath::Ring { taker, .. } => taker.skips(),
            RxPath::Adaptive(a) => a.taker.skips(),
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
            RxPath::Ring { ring, taker } => {
                let now = taker.now();
                let n = ring.drain(&mut |frame, status| {
                    taker.take(frame, ring_meta(status), now, f);
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
                for (s, count) in x.socks.iter_mut().zip(x.per_queue.iter_mut()) {
                    // AF_XDP reports no checksum state: a local sender's unfinished
                    // checksum cannot be told from a finished one.
                    let meta = FrameMeta { csum: Csum::UnknownOrPartial, vlan_tci: None };
                    let got = s.drain(&mut |frame| match parse_frame(frame, want, meta) {
                        Ok(u) => f(u.payload, u.src),
                        Err(e) => skips.count(e),
                    });
                    *count += got as u64;
                    n += got;
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
