//! Responses written as whole frames: a PF_PACKET TPACKET_V2 transmit ring per output
//! interface, or the AF_XDP socket's own TX ring. The Ethernet, IP and UDP headers come
//! from `proto::frames` (checksums, IP fragments past the MTU); where they go comes from
//! the kernel's routes and neighbours (`netlane::topology::nexthop`, kept current by
//! netlink notifications).
//!
//! Whatever cannot go this way goes through the service's UDP socket instead, counted
//! by reason: a loopback address (which the kernel accepts from its own stack only), a
//! next hop the kernel has not resolved yet (the socket send makes it resolve), an
//! output interface the AF_XDP socket is not on, a transmit ring that
//! stayed full for a second.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::str::FromStr;
use std::time::{Duration, Instant};

use netlane::topology::nexthop::{NextHop, NextHopStats, NextHops, Unresolved};
use netlane_sys::packet::PacketTx;
use netlane_sys::xsk::XskTx;
use serde::{Deserialize, Serialize};

use crate::proto::frames::{Datagram, Link};
use crate::proto::ipid::IpIds;
use crate::proto::packet::{ETH_LEN, IPPROTO_UDP};

/// How responses leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TxKind {
    /// The service's UDP socket (`sendto`, GSO for segments).
    #[default]
    Socket,
    /// Whole frames through a PF_PACKET transmit ring.
    Packet,
    /// Whole frames through the AF_XDP socket's TX ring (the af-xdp path only).
    AfXdp,
}

impl TxKind {
    /// Every kind, in report order.
    pub const ALL: [TxKind; 3] = [TxKind::Socket, TxKind::Packet, TxKind::AfXdp];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            TxKind::Socket => "socket",
            TxKind::Packet => "packet",
            TxKind::AfXdp => "af-xdp",
        }
    }
}

impl fmt::Display for TxKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TxKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        TxKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = TxKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown transmit path {s:?}: expected one of {}", names.join(", "))
        })
    }
}

/// What the frame transmit path did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RawTxReport {
    /// Datagrams written as frames.
    pub datagrams: u64,
    /// Of those, sent as IP fragments.
    pub fragmented: u64,
    /// Whether the packet rings were asked to leave checksums to the device.
    pub checksum_offload: bool,
    /// Of those, with the UDP checksum left for the device to finish (packet rings with
    /// checksum offload; a fragmented datagram is always summed here).
    pub checksum_offloaded: u64,
    /// Frames written.
    pub frames: u64,
    /// Transmit system calls (ring kicks).
    pub kicks: u64,
    /// Sent through the socket instead: the kernel had no link-layer address yet.
    pub via_socket_unresolved: u64,
    /// Sent through the socket instead: a loopback address (the kernel drops frames from
    /// 127.0.0.0/8 or ::1 that arrive on a device: `IP_LOCALNET`).
    pub via_socket_loopback: u64,
    /// Sent through the socket instead: no unicast route, or not an Ethernet link.
    pub via_socket_no_route: u64,
    /// Sent through the socket instead: the route leaves by an interface the AF_XDP
    /// socket is not bound to.
    pub via_socket_other_interface: u64,
    /// Responses dropped because the ring stayed full for a second (the client asks
    /// again).
    pub ring_full_drops: u64,
    /// Sent through the socket instead: a route lookup, a ring that could not be
    /// opened (remembered per interface), or a datagram the link cannot frame.
    pub via_socket_error: u64,
    /// Transmit rings opened (one per output interface for the packet path).
    pub rings: usize,
    /// Route, neighbour and link lookups and notifications.
    pub nexthops: NextHopStats,
}

enum Sink {
    /// Rings by output interface; `None` for an interface whose ring could not be
    /// opened (not tried again); whether they leave checksums to the device.
    Packet(HashMap<u32, Option<PacketTx>>, bool),
    Xdp {
        tx: XskTx,
        ifindex: u32,
    },
}

/// The most packet transmit rings (one per output interface) a server opens.
const MAX_RINGS: usize = 16;
/// Bytes of frame slots per packet transmit ring.
const RING_BYTES: usize = 4 << 20;
/// The largest packet slot: frames bigger than this are IP-fragmented to fit (loopback's
/// 64 KiB MTU included).
const MAX_SLOT: usize = 16_384 + 64;

/// The frame transmit path, set up.
pub struct RawTx {
    hops: NextHops,
    src: IpAddr,
    port: u16,
    sink: Sink,
    ids: IpIds,
    report: RawTxReport,
}

impl fmt::Debug for RawTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawTx").field("src", &self.src).field("port", &self.port).finish_non_exhaustive()
    }
}

/// The outcome of one response.
pub enum Sent {
    /// Written as frames.
    Frames,
    /// Not sent: send it through the socket.
    UseSocket,
    /// Dropped: the ring stayed full.
    Dropped,
}

impl RawTx {
    /// A packet-ring transmit path answering from `local` (a specific address); with
    /// `checksum_offload`, a datagram that goes as one frame leaves its UDP checksum to
    /// the device (`PACKET_VNET_HDR`), otherwise every checksum is summed here.
    pub fn packet(local: SocketAddr, checksum_offload: bool) -> io::Result<RawTx> {
        RawTx::new(local, Sink::Packet(HashMap::new(), checksum_offload))
    }

    /// An AF_XDP transmit path on interface `ifindex`, answering from `local`.
    pub fn xdp(local: SocketAddr, tx: XskTx, ifindex: u32) -> io::Result<RawTx> {
        RawTx::new(local, Sink::Xdp { tx, ifindex })
    }

    fn new(local: SocketAddr, sink: Sink) -> io::Result<RawTx> {
        if local.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frames need a source address: listen on a specific address for `tx` packet or af-xdp",
            ));
        }
        if local.ip().is_loopback() {
            tracing::warn!(
                %local,
                "frames from a loopback address are dropped by the kernel (IP_LOCALNET): every response will go \
                 through the socket"
            );
        }
        // A key of its own for every run: which counter a client takes, and where the
        // counters start, so fragments of two runs cannot be confused by a receiver.
        let key = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        Ok(RawTx {
            hops: NextHops::open()?,
            src: local.ip(),
            port: local.port(),
            sink,
            ids: IpIds::new(key as u64),
            report: RawTxReport::default(),
        })
    }

    /// The descriptor the kernel's route and neighbour notifications arrive on.
    pub fn events_fd(&self) -> BorrowedFd<'_> {
        self.hops.events_fd()
    }

    /// Reads the notifications (call when [`RawTx::events_fd`] is readable).
    pub fn process_events(&mut self) {
        self.hops.process_events();
    }

    /// What it did so far.
    pub fn report(&self) -> RawTxReport {
        let mut r = self.report.clone();
        r.nexthops = self.hops.stats();
        match &self.sink {
            Sink::Packet(rings, offload) => {
                r.checksum_offload = *offload;
                r.rings = rings.values().flatten().count();
                for t in rings.values().flatten() {
                    let c = t.counts();
                    r.kicks += c.kicks;
                }
            }
            Sink::Xdp { tx, .. } => {
                r.rings = 1;
                r.kicks += tx.counts().kicks;
            }
        }
        r
    }

    /// Writes `data` to `to` as frames: one datagram, or one per `segment_len` bytes
    /// (application segments). Queued frames go out at [`RawTx::flush`] (or sooner when
    /// a ring fills).
    pub fn send(&mut self, data: &[u8], segment_len: usize, to: SocketAddr) -> io::Result<Sent> {
        if to.ip().is_loopback() || self.src.is_loopback() {
            self.report.via_socket_loopback += 1;
            return Ok(Sent::UseSocket);
        }
        let hop = match self.hops.lookup(to.ip(), self.src) {
            Ok(Ok(h)) => h,
            Err(e) => {
                tracing::debug!(error = %e, "next-hop lookup failed");
                self.report.via_socket_error += 1;
                return Ok(Sent::UseSocket);
            }
            Ok(Err(why)) => return Ok(self.unresolved(why)),
        };
        if let Sink::Xdp { ifindex, .. } = self.sink
            && hop.ifindex != ifindex
        {
            self.report.via_socket_other_interface += 1;
            return Ok(Sent::UseSocket);
        }
        let src = SocketAddr::new(self.src, self.port);
        for (k, seg) in data.chunks(segment_len.max(1)).enumerate() {
            match self.send_datagram(&hop, src, to, seg)? {
                Queued::Yes => {}
                // Nothing of the response went as frames yet: the socket takes it.
                Queued::CannotFrame if k == 0 => {
                    self.report.via_socket_error += 1;
                    return Ok(Sent::UseSocket);
                }
                Queued::CannotFrame | Queued::Full => {
                    self.report.ring_full_drops += 1;
                    return Ok(Sent::Dropped);
                }
            }
        }
        Ok(Sent::Frames)
    }

    fn unresolved(&mut self, why: Unresolved) -> Sent {
        match why {
            Unresolved::Neighbour => self.report.via_socket_unresolved += 1,
            Unresolved::NoRoute | Unresolved::NotEthernet => self.report.via_socket_no_route += 1,
        }
        Sent::UseSocket
    }

    /// Whether frames wait for a kick (the server then wakes soon to send them even
    /// when no request comes).
    pub fn pending(&self) -> bool {
        match &self.sink {
            Sink::Packet(rings, _) => rings.values().flatten().any(|t| t.pending() > 0),
            Sink::Xdp { tx, .. } => tx.in_flight() > 0,
        }
    }

    fn send_datagram(&mut self, hop: &NextHop, src: SocketAddr, to: SocketAddr, payload: &[u8]) -> io::Result<Queued> {
        let link = Link { src_mac: hop.src_mac, dst_mac: hop.dst_mac, mtu: hop.mtu as usize };
        let id = self.ids.next(src.ip(), to.ip(), IPPROTO_UDP);
        let Some(ring) = self.ring(hop) else { return Ok(Queued::CannotFrame) };
        let d = match Datagram::new(link, src, to, payload, id, ring.max_frame()) {
            Ok(d) if d.frames() <= ring.capacity() && ring.checksum_offload() => d.with_checksum_offload(),
            Ok(d) if d.frames() <= ring.capacity() => d,
            _ => return Ok(Queued::CannotFrame),
        };
        // Room for every frame first, so a datagram goes out whole or not at all; a full
        // ring is kicked and waited on (up to a second, as the socket path waits for its
        // buffer), never half-filled with orphan fragments.
        let deadline = Instant::now() + Duration::from_secs(1);
        while !ring.room(d.frames()) {
            ring.flush()?;
            if ring.room(d.frames()) {
                break;
            }
            if Instant::now() >= deadline {
                return Ok(Queued::Full);
            }
            ring.wait();
        }
        for i in 0..d.frames() {
            let len = d.frame_len(i);
            if !ring.push(len, d.checksum_offload(), &mut |slot: &mut [u8]| {
                d.write(i, slot);
            })? {
                return Ok(Queued::Full);
            }
        }
        if d.checksum_offload().is_some() {
            self.report.checksum_offloaded += 1;
        }
        self.report.datagrams += 1;
        self.report.frames += d.frames() as u64;
        if d.fragmented() {
            self.report.fragmented += 1;
        }
        Ok(Queued::Yes)
    }

    /// The ring frames to `hop` go through (a packet ring is opened on first use of an
    /// interface, with slots that fit its MTU up to [`MAX_SLOT`]); None when there is
    /// none (too many interfaces, or it could not be opened: logged once).
    fn ring(&mut self, hop: &NextHop) -> Option<&mut dyn Ring> {
        match &mut self.sink {
            Sink::Xdp { tx, .. } => Some(tx),
            Sink::Packet(rings, offload) => {
                if !rings.contains_key(&hop.ifindex) {
                    if rings.len() >= MAX_RINGS {
                        return None;
                    }
                    let vnet = if *offload { netlane_sys::packet::VNET_HDR_LEN } else { 0 };
                    let slot = (hop.mtu as usize + ETH_LEN + 32 + vnet).next_multiple_of(16).clamp(2048, MAX_SLOT);
                    let frames = (RING_BYTES / slot).max(256) as u32;
                    let open = if *offload { PacketTx::open_with_checksum_offload } else { PacketTx::open };
                    let t = open(hop.ifindex, slot as u32, frames)
                        .inspect_err(|e| {
                            tracing::warn!(error = %e, ifindex = hop.ifindex, "no packet transmit ring: using the socket")
                        })
                        .ok();
                    rings.insert(hop.ifindex, t);
                }
                rings.get_mut(&hop.ifindex).and_then(Option::as_mut).map(|t| t as &mut dyn Ring)
            }
        }
    }

    /// Hands every queued frame to the kernel.
    pub fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            // Every ring is kicked; the first error is reported.
            Sink::Packet(rings, _) => rings.values_mut().flatten().map(PacketTx::flush).fold(Ok(()), Result::and),
            Sink::Xdp { tx, .. } => tx.flush(),
        }
    }
}

/// Whether a datagram was queued.
enum Queued {
    Yes,
    /// No ring, or the link cannot carry it as frames: nothing was queued.
    CannotFrame,
    /// The ring stayed full.
    Full,
}

/// A transmit ring of either kind.
trait Ring {
    fn max_frame(&self) -> usize;
    fn capacity(&self) -> usize;
    fn room(&mut self, frames: usize) -> bool;
    /// Whether a frame may leave its transport checksum to the device.
    fn checksum_offload(&self) -> bool;
    /// Queues a frame; `csum` (only where [`Ring::checksum_offload`]) says where the
    /// device finishes its checksum.
    fn push(&mut self, len: usize, csum: Option<(u16, u16)>, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<bool>;
    fn flush(&mut self) -> io::Result<()>;
    /// Waits a little for slots to come back.
    fn wait(&self);
}

impl Ring for PacketTx {
    fn max_frame(&self) -> usize {
        PacketTx::max_frame(self)
    }
    fn checksum_offload(&self) -> bool {
        PacketTx::checksum_offload(self)
    }
    fn push(&mut self, len: usize, csum: Option<(u16, u16)>, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<bool> {
        match csum {
            Some((start, offset)) => PacketTx::push_partial(self, len, start, offset, fill),
            None => PacketTx::push(self, len, fill),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        PacketTx::flush(self)
    }
    fn room(&mut self, frames: usize) -> bool {
        PacketTx::room(self, frames)
    }
    fn capacity(&self) -> usize {
        PacketTx::capacity(self)
    }
    fn wait(&self) {
        // Writable when the slot at the head is free again.
        let mut fds = [nix::poll::PollFd::new(self.as_fd(), nix::poll::PollFlags::POLLOUT)];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1u8));
    }
}

impl Ring for XskTx {
    fn max_frame(&self) -> usize {
        XskTx::max_frame(self)
    }
    fn checksum_offload(&self) -> bool {
        false
    }
    fn push(&mut self, len: usize, _csum: Option<(u16, u16)>, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<bool> {
        XskTx::push(self, len, fill)
    }
    fn flush(&mut self) -> io::Result<()> {
        XskTx::flush(self)
    }
    fn room(&mut self, frames: usize) -> bool {
        XskTx::room(self, frames)
    }
    fn capacity(&self) -> usize {
        XskTx::capacity(self)
    }
    fn wait(&self) {
        // An AF_XDP socket polls writable while its TX ring has room, even with every
        // frame in flight: poll would not wait. Completions come back within microseconds.
        std::thread::sleep(Duration::from_micros(50));
    }
}
