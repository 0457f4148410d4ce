//! A PF_PACKET TPACKET_V2 transmit ring: user space writes whole link-layer frames into
//! the ring's slots and one `send` hands every marked frame to the kernel; with
//! `PACKET_VNET_HDR` a frame may leave its transport checksum to the device.

use std::io;
use std::mem::{self, offset_of};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use super::page_size;
use crate::cvt;
use crate::mapping::Mapping;
use crate::sockopt::{set_int, set_raw};

/// Where a TPACKET_V2 transmit frame's data starts: after the aligned header (the kernel
/// takes `tp_hdrlen - sizeof(sockaddr_ll)` when PACKET_TX_HAS_OFF is off).
const TX_DATA_OFFSET: usize = (mem::size_of::<libc::tpacket2_hdr>() + 15) & !15;

/// What the transmit ring did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxCounts {
    /// Frames handed to the kernel.
    pub frames: u64,
    /// `send` calls that asked the kernel to transmit.
    pub kicks: u64,
    /// Times the slot at the head was still in flight (the ring was full).
    pub full: u64,
    /// Frames whose transport checksum the device (or the kernel, for a device without
    /// the offload) finished ([`PacketTx::push_partial`]).
    pub csum_offloaded: u64,
}

/// Bytes of `struct virtio_net_hdr`, which leads every frame of a ring with
/// `PACKET_VNET_HDR` (a slot of such a ring holds that many bytes less of frame).
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: finish the checksum at `csum_start + csum_offset`
/// over the bytes from `csum_start` on.
const VNET_F_NEEDS_CSUM: u8 = 1;

/// A packet socket with a memory-mapped TPACKET_V2 transmit ring, bound to one
/// interface: user space writes whole link-layer frames into free slots, marks them
/// `TP_STATUS_SEND_REQUEST`, and one `send` transmits every marked frame in ring order;
/// the kernel sets a slot back to `TP_STATUS_AVAILABLE` once its packet is freed.
#[derive(Debug)]
pub struct PacketTx {
    // The mapping goes before the socket that owns the ring.
    map: Mapping,
    fd: OwnedFd,
    block_size: usize,
    frame_size: usize,
    frames: usize,
    next: usize,
    pending: usize,
    counts: TxCounts,
    /// Every frame is led by a `virtio_net_hdr` (`PACKET_VNET_HDR`).
    vnet_hdr: bool,
}

// SAFETY: as for `PacketRing`: the mapping belongs to this value alone.
unsafe impl Send for PacketTx {}

impl PacketTx {
    /// Opens a packet socket on interface `ifindex` with a ring of `frames` slots of
    /// `frame_size` bytes (a multiple of 16, at most 64 KiB + header); frames are sent
    /// through the interface's qdisc, and a malformed frame is skipped (PACKET_LOSS: the
    /// kernel hands its slot back) instead of stopping the ring.
    pub fn open(ifindex: u32, frame_size: u32, frames: u32) -> io::Result<PacketTx> {
        PacketTx::open_with(ifindex, frame_size, frames, false)
    }

    /// As [`PacketTx::open`], with a `virtio_net_hdr` before every frame
    /// (`PACKET_VNET_HDR`), so that [`PacketTx::push_partial`] can leave a frame's
    /// transport checksum to the device: a slot holds that many bytes less.
    pub fn open_with_checksum_offload(ifindex: u32, frame_size: u32, frames: u32) -> io::Result<PacketTx> {
        PacketTx::open_with(ifindex, frame_size, frames, true)
    }

    fn open_with(ifindex: u32, frame_size: u32, frames: u32, vnet_hdr: bool) -> io::Result<PacketTx> {
        let page = page_size() as u32;
        if frame_size < 128 || !frame_size.is_multiple_of(16) || frames == 0 || ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a transmit ring needs an interface, frames that are a multiple of 16 bytes (128 at least), and one \
                 frame at least",
            ));
        }
        let block_size = frame_size.div_ceil(page) * page;
        let per_block = block_size / frame_size;
        let blocks = frames.div_ceil(per_block);
        let frames = blocks * per_block;
        // SAFETY: socket(2) with constant arguments; the result is checked. Protocol 0:
        // this socket receives nothing.
        let raw = cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_int(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, libc::tpacket_versions::TPACKET_V2 as i32)?;
        set_int(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_LOSS, 1)?;
        if vnet_hdr {
            // Before the ring: the kernel refuses it on a socket that has one.
            set_int(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, 1)?;
        }
        let req = libc::tpacket_req {
            tp_block_size: block_size,
            tp_block_nr: blocks,
            tp_frame_size: frame_size,
            tp_frame_nr: frames,
        };
        set_raw(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_TX_RING, &req)?;
        let map = Mapping::new(block_size as usize * blocks as usize, Some(fd.as_fd()), 0)?;
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a live sockaddr_ll and its size is passed with it.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(PacketTx {
            map,
            fd,
            block_size: block_size as usize,
            frame_size: frame_size as usize,
            frames: frames as usize,
            next: 0,
            pending: 0,
            counts: TxCounts::default(),
            vnet_hdr,
        })
    }

    /// The largest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.frame_size - TX_DATA_OFFSET - if self.vnet_hdr { VNET_HDR_LEN } else { 0 }
    }

    /// Whether frames may leave their checksum to the device
    /// ([`PacketTx::open_with_checksum_offload`]).
    pub fn checksum_offload(&self) -> bool {
        self.vnet_hdr
    }

    /// What the ring did so far.
    pub fn counts(&self) -> TxCounts {
        self.counts
    }

    fn slot(&self, i: usize) -> usize {
        let per_block = self.block_size / self.frame_size;
        (i / per_block) * self.block_size + (i % per_block) * self.frame_size
    }

    /// Queues one frame of `len` bytes written by `fill` into the next slot. Returns
    /// false (and calls nothing) when that slot is still in flight: the ring is full;
    /// [`PacketTx::flush`] and wait for [`PacketTx::as_fd`] to be writable.
    pub fn push(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> io::Result<bool> {
        self.push_with(len, None, fill)
    }

    /// As [`PacketTx::push`], for a frame whose transport checksum field (at byte
    /// `csum_start + csum_offset`) holds the pseudo-header's sum: the device finishes it
    /// over the bytes from `csum_start` on (`VIRTIO_NET_HDR_F_NEEDS_CSUM`; a device
    /// without the offload has the kernel do it). Only on a ring opened with
    /// [`PacketTx::open_with_checksum_offload`].
    pub fn push_partial(
        &mut self,
        len: usize,
        csum_start: u16,
        csum_offset: u16,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<bool> {
        if !self.vnet_hdr {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "this ring has no checksum offload"));
        }
        if usize::from(csum_start) + usize::from(csum_offset) + 2 > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a checksum at {csum_start}+{csum_offset} lies past a {len}-byte frame"),
            ));
        }
        let pushed = self.push_with(len, Some((csum_start, csum_offset)), fill)?;
        if pushed {
            self.counts.csum_offloaded += 1;
        }
        Ok(pushed)
    }

    fn push_with(&mut self, len: usize, csum: Option<(u16, u16)>, fill: impl FnOnce(&mut [u8])) -> io::Result<bool> {
        if len == 0 || len > self.max_frame() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a {len}-byte frame: a slot holds 1..={}", self.max_frame()),
            ));
        }
        let base = self.slot(self.next);
        let st = self.map.word(base + offset_of!(libc::tpacket2_hdr, tp_status));
        let status = st.load(Ordering::Acquire);
        if status & (libc::TP_STATUS_SEND_REQUEST | libc::TP_STATUS_SENDING) != 0 {
            self.counts.full += 1;
            return Ok(false);
        }
        let lead = if self.vnet_hdr { VNET_HDR_LEN } else { 0 };
        let data = self
            .map
            .bytes_mut(base + TX_DATA_OFFSET, lead + len)
            .ok_or_else(|| io::Error::other("slot outside the ring"))?;
        let (vnet, frame) = data.split_at_mut(lead);
        if self.vnet_hdr {
            // virtio_net_hdr: flags, gso_type (none), hdr_len, gso_size, csum_start,
            // csum_offset; the 16-bit fields in the host's byte order (legacy virtio's,
            // which the packet socket reads them in). hdr_len 0: the kernel takes the
            // headers the checksum needs into the linear part itself.
            vnet.fill(0);
            if let Some((start, offset)) = csum {
                vnet[0] = VNET_F_NEEDS_CSUM;
                vnet[6..8].copy_from_slice(&start.to_ne_bytes());
                vnet[8..10].copy_from_slice(&offset.to_ne_bytes());
            }
        }
        fill(frame);
        self.map.write::<u32>(base + offset_of!(libc::tpacket2_hdr, tp_len), (lead + len) as u32);
        self.map
            .word(base + offset_of!(libc::tpacket2_hdr, tp_status))
            .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.next = (self.next + 1) % self.frames;
        self.pending += 1;
        self.counts.frames += 1;
        Ok(true)
    }

    /// Sends `n` frames of `frames` in turn, from `frames[*next]` on (wrapping; `next`
    /// left at the one after the last sent): whenever the ring is full, hands what it
    /// holds to the kernel and yields the CPU; at the end, hands the rest over.
    pub fn send_in_turn(&mut self, frames: &[Vec<u8>], next: &mut usize, n: usize) -> io::Result<()> {
        if frames.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no frames to send"));
        }
        let mut left = n;
        while left > 0 {
            let fr = &frames[*next % frames.len()];
            if self.push(fr.len(), |d| d.copy_from_slice(fr))? {
                *next = (*next + 1) % frames.len();
                left -= 1;
            } else {
                self.flush()?;
                std::thread::yield_now();
            }
        }
        self.flush()
    }

    /// Frames queued and not yet handed to the kernel.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Asks the kernel to transmit every queued frame (one `send`, not waiting).
    pub fn flush(&mut self) -> io::Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        self.counts.kicks += 1;
        // SAFETY: a zero-length send with a null buffer is how a TX ring is kicked
        // (packet_mmap.rst); the kernel reads the frames from the ring.
        let rc = unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            // ENOBUFS/EAGAIN: the device queue is full; the frames stay marked and go
            // with the next kick.
            if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOBUFS)) {
                return Err(e);
            }
            return Ok(());
        }
        // With MSG_DONTWAIT the kernel stops early when the socket's send buffer is full
        // (and still returns what it sent): the frames it did not take keep their
        // send-request status and stay pending for the next kick.
        self.pending = self.still_requested();
        Ok(())
    }

    fn status(&self, i: usize) -> u32 {
        self.map.word(self.slot(i) + offset_of!(libc::tpacket2_hdr, tp_status)).load(Ordering::Acquire)
    }

    /// How many of the pending frames (the `pending` slots before `next`) the kernel has
    /// not taken yet.
    fn still_requested(&self) -> usize {
        let first = (self.next + self.frames - self.pending.min(self.frames)) % self.frames;
        (0..self.pending.min(self.frames))
            .filter(|k| self.status((first + k) % self.frames) & libc::TP_STATUS_SEND_REQUEST != 0)
            .count()
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> usize {
        self.frames
    }

    /// Whether the next `n` slots are free, so a datagram's `n` frames go out whole or
    /// not at all.
    pub fn room(&self, n: usize) -> bool {
        n <= self.frames
            && (0..n).all(|k| {
                self.status((self.next + k) % self.frames) & (libc::TP_STATUS_SEND_REQUEST | libc::TP_STATUS_SENDING)
                    == 0
            })
    }
}

impl AsFd for PacketTx {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
