//! The packet ring paths: the ring's geometry, one TPACKET_V2 or V3 ring behind the
//! service's filter, and the adaptive mode's rings of several block sizes in one fanout
//! group.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use netlane_sys::bpf::RingSelect;
use netlane_sys::packet::{BlockCounts, Insn, PacketRing, RingSpec, attach_filter, page_size};

use super::{PathKind, RingSkips, RxPath, service_of};
use crate::proto::adapt::{BlockChooser, WindowCounts};
use crate::proto::packet::{
    Csum, Found, FrameMeta, ServiceAddr, parse_frame_or_fragment, parse_reassembled, udp_service_filter,
};
use crate::proto::reasm::{ReasmLimits, Reassembler};

/// ETH_P_ALL: every protocol (the filter picks).
const ETH_P_ALL: u16 = 0x0003;

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

/// What became of one frame.
pub(super) struct Taken {
    /// It was the service's: a whole datagram, or a fragment to its address.
    service: bool,
    /// The sender of the request it completed.
    request: Option<SocketAddr>,
}

/// What a packet ring path does with each frame: a whole datagram for the service goes
/// to the handler; a fragment to the reassembler (bounded as the kernel's is:
/// [`ReasmLimits::KERNEL`]), whose whole datagrams are checked and handed on alike;
/// anything else is counted.
#[derive(Debug)]
pub struct RingTaker {
    want: ServiceAddr,
    skips: RingSkips,
    reasm: Reassembler,
    epoch: std::time::Instant,
}

impl RingTaker {
    pub(super) fn new(want: ServiceAddr) -> RingTaker {
        RingTaker {
            want,
            skips: RingSkips::default(),
            reasm: Reassembler::new(ReasmLimits::KERNEL),
            epoch: std::time::Instant::now(),
        }
    }

    /// The clock for one pass over a ring; gives up the datagrams whose fragments
    /// timed out.
    pub(super) fn now(&mut self) -> u64 {
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.reasm.handle_timeout(now);
        now
    }

    /// Takes one frame at `now`; hands a datagram it completes to `f`.
    pub(super) fn take(
        &mut self,
        frame: &[u8],
        meta: FrameMeta,
        now: u64,
        f: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Taken {
        match parse_frame_or_fragment(frame, self.want, meta) {
            Ok(Found::Datagram(u)) => {
                f(u.payload, u.src);
                Taken { service: true, request: Some(u.src) }
            }
            Ok(Found::Fragment(frag)) => {
                self.skips.fragments += 1;
                self.reasm.handle_fragment(now, frag);
                let Some(whole) = self.reasm.poll_datagram() else { return Taken { service: true, request: None } };
                match parse_reassembled(&whole, self.want) {
                    Ok(u) => {
                        f(u.payload, u.src);
                        Taken { service: true, request: Some(u.src) }
                    }
                    Err(e) => {
                        self.skips.count(e);
                        Taken { service: true, request: None }
                    }
                }
            }
            Err(e) => {
                self.skips.count(e);
                Taken { service: false, request: None }
            }
        }
    }

    /// The path will hand some frames over up to `delay` late (an adaptive switch: the
    /// old ring's open block waits for its retire timer).
    pub(super) fn reordering_for(&mut self, delay: std::time::Duration) {
        let until = self.epoch.elapsed().saturating_add(delay).as_nanos() as u64;
        self.reasm.handle_reordering_until(until);
    }

    pub(super) fn skips(&self) -> RingSkips {
        RingSkips { reasm: self.reasm.counters(), ..self.skips }
    }
}

/// The adaptive TPACKET_V3 path's parts: rings of several block sizes in one packet
/// fanout group, whose program hands each frame to the active ring only. (Idle rings
/// behind a drop-everything filter cost a delivery per ring and frame in the receive
/// softirq: with ten rings, the server CPU spent more per request than on one fixed
/// ring.)
#[derive(Debug)]
pub struct AdaptivePath {
    pub(super) rings: Vec<PacketRing>,
    select: RingSelect,
    chooser: BlockChooser,
    /// The active ring's block counts when the current window began.
    base: BlockCounts,
    pub(super) taker: RingTaker,
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

    pub(super) fn drain(&mut self, f: &mut dyn FnMut(&[u8], SocketAddr)) -> io::Result<usize> {
        let mut n = 0;
        let (chooser, taker) = (&mut self.chooser, &mut self.taker);
        let now_reasm = taker.now();
        for ring in &mut self.rings {
            n += ring.drain(&mut |frame, status| {
                // Every frame of the service fills the ring, a fragment as much as a
                // whole request; the burst is counted in requests.
                let taken = taker.take(frame, ring_meta(status), now_reasm, f);
                if taken.service {
                    chooser.on_frame(frame.len());
                }
                if let Some(src) = taken.request {
                    chooser.on_request(src);
                }
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
            // The old ring's open block comes when it retires: fragments in it come after
            // later ones of their datagrams.
            let retire = match self.rings[old].spec() {
                // 0: the kernel derives it from the link speed, 8 ms when unknown.
                RingSpec::V3 { retire_ms: 0, .. } => std::time::Duration::from_millis(8),
                RingSpec::V3 { retire_ms, .. } => std::time::Duration::from_millis(u64::from(retire_ms)),
                RingSpec::V2 { .. } => std::time::Duration::ZERO,
            };
            self.taker.reordering_for(retire * 2 + std::time::Duration::from_millis(10));
        } else if self.chooser.window_ended(now) {
            self.base = c;
        }
        Ok(n)
    }
}

impl RxPath {
    /// The adaptive TPACKET_V3 path on interface `ifindex` (0: all) for the service
    /// socket `sock`.
    pub(super) fn open_adaptive(sock: &UdpSocket, ring: &RingOptions, ifindex: u32) -> io::Result<RxPath> {
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
            let id = r.join_fanout(group).map_err(|e| io::Error::new(e.kind(), format!("packet fanout group: {e}")))?;
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
            taker: RingTaker::new(want),
            started: std::time::Instant::now(),
        })))
    }

    /// A TPACKET_V2 or V3 ring (`kind`) on interface `ifindex` (0: all) for the service
    /// socket `sock`.
    pub(super) fn open_ring(kind: PathKind, sock: &UdpSocket, ring: &RingOptions, ifindex: u32) -> io::Result<RxPath> {
        let spec = ring.spec(kind).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let want = service_of(sock)?;
        let ring = PacketRing::open(ETH_P_ALL, ifindex, &ring_filter(want), spec)?;
        // The service socket stays bound (so the port never answers with ICMP
        // unreachable) but reads nothing: a filter that drops every datagram
        // keeps it from queueing a second copy of each request.
        let drop_all = [Insn { code: 0x06, jt: 0, jf: 0, k: 0 }];
        attach_filter(sock.as_fd(), &drop_all)?;
        Ok(RxPath::Ring { ring, taker: Box::new(RingTaker::new(want)) })
    }
}

/// What a packet ring's frame header says, in the parser's terms.
pub(super) fn ring_meta(s: netlane_sys::packet::FrameStatus) -> FrameMeta {
    let csum = if s.csum_valid {
        Csum::Verified
    } else if s.csum_not_ready {
        Csum::Partial
    } else {
        Csum::Unknown
    };
    FrameMeta { csum, vlan_tci: s.vlan_tci }
}

/// The kernel's form of [`udp_service_filter`] for `want`.
fn ring_filter(want: ServiceAddr) -> Vec<Insn> {
    udp_service_filter(want).iter().map(|i| Insn { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect()
}
