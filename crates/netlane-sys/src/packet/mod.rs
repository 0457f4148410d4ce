//! PF_PACKET receive rings (TPACKET_V2 frames, TPACKET_V3 blocks), memory-mapped and
//! shared with the kernel, with a classic BPF filter so the socket sees only the
//! traffic it is for.
//!
//! The kernel fills a frame (V2) or a block of frames (V3), then sets `TP_STATUS_USER`
//! in its status word; user space reads it and hands it back by writing
//! `TP_STATUS_KERNEL`. Both sides touch the status word concurrently, so it is read with
//! acquire and written with release ordering (packet_mmap.rst; the kernel pairs them
//! with `smp_wmb`/`smp_rmb` in af_packet.c). A packet socket gets a copy of each
//! packet: other sockets (the service's own UDP socket, tcpdump) still get theirs.

use std::io;
use std::mem::{self, offset_of};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use crate::cvt;
use crate::mapping::Mapping;
use crate::sockopt::{get_raw, set_int, set_raw};

mod tx;
pub use tx::{PacketTx, TxCounts, VNET_HDR_LEN};

/// The ring layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingSpec {
    /// TPACKET_V2: `frames` fixed-size frames of `frame_size` bytes, in blocks of
    /// `block_size` bytes.
    V2 {
        /// Bytes per block (a multiple of the page size).
        block_size: u32,
        /// Bytes per frame (a multiple of 16, at most a block).
        frame_size: u32,
        /// Frames in all.
        frames: u32,
    },
    /// TPACKET_V3: `blocks` blocks of `block_size` bytes holding variable-size frames;
    /// a block is handed to user space when full or after `retire_ms`.
    V3 {
        /// Bytes per block (a multiple of the page size).
        block_size: u32,
        /// Blocks.
        blocks: u32,
        /// Largest frame the block may hold (the kernel's accounting unit).
        frame_size: u32,
        /// Milliseconds after which a partly filled block is retired (0: the kernel
        /// derives it from the link speed; 8 ms when unknown).
        retire_ms: u32,
    },
}

impl RingSpec {
    /// Bytes the ring maps.
    pub fn bytes(&self) -> usize {
        match *self {
            RingSpec::V2 { block_size, frame_size, frames } => {
                let per_block = (block_size / frame_size.max(1)).max(1);
                frames.div_ceil(per_block) as usize * block_size as usize
            }
            RingSpec::V3 { block_size, blocks, .. } => block_size as usize * blocks as usize,
        }
    }
}

/// The system's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf(3) has no memory effects; _SC_PAGESIZE is always valid.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 { v as usize } else { 4096 }
}

/// One classic BPF instruction (`struct sock_filter`).
pub type Insn = libc::sock_filter;

/// What a received frame's ring header says about it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameStatus {
    /// `TP_STATUS_CSUM_VALID`: the kernel or the device verified the transport checksum.
    pub csum_valid: bool,
    /// `TP_STATUS_CSUMNOTREADY`: a sender on this machine left the checksum to offload.
    pub csum_not_ready: bool,
    /// The VLAN tag the device or the stack took off the frame (`TP_STATUS_VLAN_VALID`).
    pub vlan_tci: Option<u16>,
}

impl FrameStatus {
    /// From a frame header's `tp_status` and `tp_vlan_tci`.
    pub fn of(status: u32, vlan_tci: u16) -> FrameStatus {
        FrameStatus {
            csum_valid: status & libc::TP_STATUS_CSUM_VALID != 0,
            csum_not_ready: status & libc::TP_STATUS_CSUMNOTREADY != 0,
            vlan_tci: (status & libc::TP_STATUS_VLAN_VALID != 0).then_some(vlan_tci),
        }
    }
}

/// The kernel's counters for a packet socket (reading them resets them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketStats {
    /// Packets that passed the filter (including dropped ones).
    pub packets: u64,
    /// Packets dropped because the ring was full.
    pub drops: u64,
    /// Times the V3 ring was frozen (every block held by user space).
    pub freezes: u64,
}

/// A packet socket with a memory-mapped receive ring.
#[derive(Debug)]
pub struct PacketRing {
    // The mapping goes before the socket that owns the ring.
    map: Mapping,
    fd: OwnedFd,
    spec: RingSpec,
    /// Frame (V2) or block (V3) to look at next.
    next: usize,
    count: usize,
    stride: usize,
    blocks: BlockCounts,
}

/// TPACKET_V3 blocks handed over so far, by why the kernel retired them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounts {
    /// Blocks retired because they were full (or the next frame did not fit).
    pub full: u64,
    /// Blocks retired by the timer (`TP_STATUS_BLK_TMO`), partly filled.
    pub timed_out: u64,
    /// Frames in all the blocks.
    pub frames: u64,
}

// SAFETY: the mapping belongs to this value alone (no aliases are handed out beyond a
// `&mut self` borrow), so moving it to another thread is as safe as moving the fd.
unsafe impl Send for PacketRing {}

impl PacketRing {
    /// Opens a packet socket for `protocol` (an ETH_P_* value, host order) on interface
    /// `ifindex` (0: every interface), attaches `filter` before any packet can arrive,
    /// ignores packets this host sends, sets up and maps the ring, then binds.
    pub fn open(protocol: u16, ifindex: u32, filter: &[Insn], spec: RingSpec) -> io::Result<PacketRing> {
        // Protocol 0 receives nothing until bind names the real one, so no packet
        // slips in before the filter.
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let raw = cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        attach_filter(fd.as_fd(), filter)?;
        set_int(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)?;
        let (count, stride) = match spec {
            RingSpec::V2 { block_size, frame_size, frames } => {
                let req = libc::tpacket_req {
                    tp_block_size: block_size,
                    tp_block_nr: spec.bytes().div_ceil(block_size as usize) as u32,
                    tp_frame_size: frame_size,
                    tp_frame_nr: frames,
                };
                set_int(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, libc::tpacket_versions::TPACKET_V2 as i32)?;
                set_raw(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
                (frames as usize, frame_size as usize)
            }
            RingSpec::V3 { block_size, blocks, frame_size, retire_ms } => {
                let req = libc::tpacket_req3 {
                    tp_block_size: block_size,
                    tp_block_nr: blocks,
                    tp_frame_size: frame_size,
                    tp_frame_nr: (block_size / frame_size.max(1)) * blocks,
                    tp_retire_blk_tov: retire_ms,
                    tp_sizeof_priv: 0,
                    tp_feature_req_word: 0,
                };
                set_int(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, libc::tpacket_versions::TPACKET_V3 as i32)?;
                set_raw(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
                (blocks as usize, block_size as usize)
            }
        };
        let map = Mapping::new(spec.bytes(), Some(fd.as_fd()), 0)?;
        let ring = PacketRing { map, fd, spec, next: 0, count, stride, blocks: BlockCounts::default() };
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = protocol.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a live sockaddr_ll and its size is passed with it.
        cvt(unsafe {
            libc::bind(
                ring.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(ring)
    }

    /// The layout.
    pub fn spec(&self) -> RingSpec {
        self.spec
    }

    /// TPACKET_V3: blocks handed over so far (zero for V2).
    pub fn block_counts(&self) -> BlockCounts {
        self.blocks
    }

    /// Joins this socket to a fanout group whose eBPF program (see
    /// [`PacketRing::set_fanout_program`]) picks, per frame, the one member that gets
    /// it: `group` None creates a new group with an id the kernel chooses, Some joins
    /// that group. Returns the group's id. Frames this host sends are left out
    /// (`PACKET_FANOUT_FLAG_IGNORE_OUTGOING`: the group's own hook replaces the
    /// members', so their `PACKET_IGNORE_OUTGOING` no longer applies).
    ///
    /// Every member must be bound to the same protocol and interface. The group
    /// registers one hook for all its members: a frame costs one delivery, not one
    /// per socket (af_packet.c: fanout_add, packet_rcv_fanout).
    ///
    /// # Minimum kernel version
    /// 6.2 (the ignore-outgoing flag, commit 58ba4263; `PACKET_FANOUT_EBPF` is 4.3).
    /// Older kernels accept the flag and ignore it, so frames the host sends reach the
    /// group (on loopback every request twice): callers check the kernel first.
    pub fn join_fanout(&self, group: Option<u16>) -> io::Result<u16> {
        let flags = libc::PACKET_FANOUT_FLAG_IGNORE_OUTGOING
            | if group.is_none() { libc::PACKET_FANOUT_FLAG_UNIQUEID } else { 0 };
        let type_flags: u32 = libc::PACKET_FANOUT_EBPF | flags;
        // The option's int: the group id in the low 16 bits, type and flags above.
        let arg = (u32::from(group.unwrap_or(0)) | (type_flags << 16)) as i32;
        set_int(self.fd.as_fd(), libc::SOL_PACKET, libc::PACKET_FANOUT, arg)?;
        let mut got: u32 = 0;
        get_raw(self.fd.as_fd(), libc::SOL_PACKET, libc::PACKET_FANOUT, &mut got)?;
        Ok(got as u16)
    }

    /// Sets the fanout group's program (a `BPF_PROG_TYPE_SOCKET_FILTER` returning the
    /// index of the member, in joining order, that takes the frame; modulo the
    /// members). Replacing a program waits for an RCU grace period in the kernel, so
    /// set it once and steer through the program's maps.
    pub fn set_fanout_program(&self, prog: BorrowedFd<'_>) -> io::Result<()> {
        let fd = prog.as_raw_fd() as u32;
        set_raw(self.fd.as_fd(), libc::SOL_PACKET, libc::PACKET_FANOUT_DATA, &fd)
    }

    /// Replaces the socket filter (`SO_ATTACH_FILTER` swaps it atomically).
    pub fn set_filter(&self, prog: &[Insn]) -> io::Result<()> {
        attach_filter(self.fd.as_fd(), prog)
    }

    /// The kernel's counters since the last call (`PACKET_STATISTICS` resets them).
    pub fn take_stats(&self) -> io::Result<PacketStats> {
        let mut s = libc::tpacket_stats_v3 { tp_packets: 0, tp_drops: 0, tp_freeze_q_cnt: 0 };
        // A V2 socket writes the first two fields only.
        get_raw(self.fd.as_fd(), libc::SOL_PACKET, libc::PACKET_STATISTICS, &mut s)?;
        Ok(PacketStats {
            packets: u64::from(s.tp_packets),
            drops: u64::from(s.tp_drops),
            freezes: if matches!(self.spec, RingSpec::V3 { .. }) { u64::from(s.tp_freeze_q_cnt) } else { 0 },
        })
    }

    /// Hands every frame user space owns to `f`, in ring order, returning each to the
    /// kernel after `f`; for V3, whole blocks. Returns the frames delivered (0: nothing
    /// was ready). `f` gets the frame from its link-layer header and what its header
    /// says about it.
    pub fn drain(&mut self, f: &mut dyn FnMut(&[u8], FrameStatus)) -> usize {
        match self.spec {
            RingSpec::V2 { .. } => self.drain_v2(f),
            RingSpec::V3 { .. } => self.drain_v3(f),
        }
    }

    fn drain_v2(&mut self, f: &mut dyn FnMut(&[u8], FrameStatus)) -> usize {
        let mut n = 0;
        // At most one lap: a frame freed here may be refilled before the loop ends.
        for _ in 0..self.count {
            let base = self.frame_offset(self.next);
            let st = self.map.word(base + offset_of!(libc::tpacket2_hdr, tp_status));
            let status = st.load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            if let Some(h) = self.map.read::<libc::tpacket2_hdr>(base) {
                let snap = (h.tp_snaplen as usize).min(self.stride.saturating_sub(usize::from(h.tp_mac)));
                f(self.map.bytes(base + usize::from(h.tp_mac), snap), FrameStatus::of(status, h.tp_vlan_tci));
            }
            st.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % self.count;
            n += 1;
        }
        n
    }

    /// Where V2 frame `i` starts: frames fill each block from its start and never cross
    /// a block boundary.
    fn frame_offset(&self, i: usize) -> usize {
        match self.spec {
            RingSpec::V2 { block_size, frame_size, .. } => {
                let per_block = (block_size / frame_size.max(1)).max(1) as usize;
                (i / per_block) * block_size as usize + (i % per_block) * frame_size as usize
            }
            RingSpec::V3 { .. } => 0,
        }
    }

    fn drain_v3(&mut self, f: &mut dyn FnMut(&[u8], FrameStatus)) -> usize {
        let mut n = 0;
        let mut counts = self.blocks;
        for _ in 0..self.count {
            let base = self.next * self.stride;
            let status_at =
                base + offset_of!(libc::tpacket_block_desc, hdr) + offset_of!(libc::tpacket_hdr_v1, block_status);
            let st = self.map.word(status_at);
            let status = st.load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            if status & libc::TP_STATUS_BLK_TMO != 0 {
                counts.timed_out += 1;
            } else {
                counts.full += 1;
            }
            let hdr_at = base + offset_of!(libc::tpacket_block_desc, hdr);
            if let Some(bh) = self.map.read::<libc::tpacket_hdr_v1>(hdr_at) {
                counts.frames += u64::from(bh.num_pkts);
                let end = base + self.stride;
                let mut at = base + bh.offset_to_first_pkt as usize;
                for _ in 0..bh.num_pkts {
                    let Some(ph) = self.map.read::<libc::tpacket3_hdr>(at) else { break };
                    let data = at + usize::from(ph.tp_mac);
                    let snap = (ph.tp_snaplen as usize).min(end.saturating_sub(data));
                    f(self.map.bytes(data, snap), FrameStatus::of(ph.tp_status, ph.hv1.tp_vlan_tci as u16));
                    n += 1;
                    if ph.tp_next_offset == 0 {
                        break;
                    }
                    at += ph.tp_next_offset as usize;
                    if at >= end {
                        break;
                    }
                }
            }
            st.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % self.count;
        }
        self.blocks = counts;
        n
    }
}

impl AsFd for PacketRing {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `SO_ATTACH_FILTER` with a classic BPF program.
pub fn attach_filter(fd: BorrowedFd<'_>, prog: &[Insn]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: prog.as_ptr().cast_mut(),
    };
    set_raw(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}
