//! AF_XDP receive sockets: a UMEM of fixed-size frames, its fill and completion rings,
//! and an RX ring, all memory-mapped and shared with the kernel (af_xdp.rst).
//!
//! Each ring is single-producer single-consumer: the producer writes descriptors, then
//! publishes its index with release ordering; the consumer reads the index with acquire
//! ordering, reads the descriptors, then publishes its own index (release) so the
//! producer may reuse the slots. User space produces the fill ring and consumes the RX
//! ring; with transmit frames configured, it also produces the TX ring and consumes the
//! completion ring through [`XskTx`], the socket's transmit half. The UMEM is split: the
//! first `frames - tx_frames` frames circulate through fill and RX, the rest through TX
//! and completion, so the two halves never touch the same frame.

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::cvt;
use crate::mapping::Mapping;
use crate::sockopt::{get_raw, set_raw};

/// How to bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XskMode {
    /// The kernel copies frames into the UMEM (works on every driver, generic XDP too).
    Copy,
    /// The driver DMAs into the UMEM (needs driver support; veth and lo have none).
    ZeroCopy,
}

/// An AF_XDP socket's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskConfig {
    /// Bytes per UMEM frame (2048 or 4096).
    pub frame_size: u32,
    /// UMEM frames.
    pub frames: u32,
    /// Entries of the RX ring and the fill ring (a power of two).
    pub ring_size: u32,
    /// UMEM frames kept for transmitting (0: receive only); the TX and completion rings
    /// get `ring_size` entries.
    pub tx_frames: u32,
}

impl XskConfig {
    /// Bytes the UMEM pins (what counts against RLIMIT_MEMLOCK).
    pub fn umem_bytes(&self) -> usize {
        self.frame_size as usize * self.frames as usize
    }
}

/// The kernel's counters for a socket (`XDP_STATISTICS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames dropped for reasons other than a full RX ring or an empty fill ring.
    pub rx_dropped: u64,
    /// Invalid descriptors.
    pub rx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times a frame found the fill ring empty.
    pub rx_fill_ring_empty: u64,
}

/// One ring: its mapping and where its indexes and descriptors are.
#[derive(Debug)]
struct Ring {
    map: Mapping,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    mask: u32,
    size: u32,
}

impl Ring {
    fn map(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        size: u32,
        desc_len: usize,
        pgoff: u64,
    ) -> io::Result<Ring> {
        let len = off.desc as usize + size as usize * desc_len;
        let map = Mapping::new(len, Some(fd), pgoff as libc::off_t)?;
        Ok(Ring {
            map,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            flags: off.flags as usize,
            desc: off.desc as usize,
            mask: size - 1,
            size,
        })
    }
}

/// The UMEM, shared by a socket's receive and transmit halves.
#[derive(Debug)]
struct Umem(Mapping);

// SAFETY: the halves touch disjoint frames (receive frames below `rx_end`, transmit
// frames above), each from one thread at a time through `&mut` of its half; the
// mapping itself is only unmapped when the last `Arc` goes.
unsafe impl Send for Umem {}
// SAFETY: as above: shared references only read receive frames or hand the transmit
// half's own frames to it.
unsafe impl Sync for Umem {}

impl std::ops::Deref for Umem {
    type Target = Mapping;
    fn deref(&self) -> &Mapping {
        &self.0
    }
}

/// An AF_XDP socket bound to one queue of one interface.
#[derive(Debug)]
pub struct Xsk {
    // Field order is drop order: the rings and socket go before the UMEM they use.
    rx: Ring,
    fill: Ring,
    tx: Option<XskTx>,
    fd: OwnedFd,
    umem: Arc<Umem>,
    cfg: XskConfig,
    mode: XskMode,
    /// Frames below this UMEM offset are the receive half's.
    rx_end: u64,
    /// RX descriptors that pointed outside the receive half (skipped).
    pub bad_descs: u64,
}

// SAFETY: every mapping belongs to this value alone; the kernel is the only other party
// and synchronises through the ring indexes, whichever thread we run on.
unsafe impl Send for Xsk {}

impl Xsk {
    /// Creates the socket and its UMEM, fills the fill ring, and binds to `queue` of
    /// interface `ifindex` in `mode`, with need-wakeup.
    pub fn open(ifindex: u32, queue: u32, cfg: XskConfig, mode: XskMode) -> io::Result<Xsk> {
        if !cfg.ring_size.is_power_of_two()
            || !cfg.frame_size.is_power_of_two()
            || cfg.tx_frames >= cfg.frames
            || cfg.tx_frames > cfg.ring_size
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "AF_XDP ring size and frame size must be powers of two, with a receive frame at least and no more \
                 transmit frames than the completion ring holds",
            ));
        }
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let raw = cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Arc::new(Umem(Mapping::new(cfg.umem_bytes(), None, 0)?));
        let reg = libc::xdp_umem_reg_v1 {
            addr: umem.ptr.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: cfg.frame_size,
            headroom: 0,
        };
        set_raw(fd.as_fd(), libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)?;
        let fill_size = cfg.ring_size;
        set_raw(fd.as_fd(), libc::SOL_XDP, libc::XDP_UMEM_FILL_RING, &fill_size)?;
        set_raw(fd.as_fd(), libc::SOL_XDP, libc::XDP_UMEM_COMPLETION_RING, &cfg.ring_size)?;
        set_raw(fd.as_fd(), libc::SOL_XDP, libc::XDP_RX_RING, &cfg.ring_size)?;
        if cfg.tx_frames > 0 {
            set_raw(fd.as_fd(), libc::SOL_XDP, libc::XDP_TX_RING, &cfg.ring_size)?;
        }
        // SAFETY: an all-zero xdp_mmap_offsets is valid; the kernel fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { mem::zeroed() };
        get_raw(fd.as_fd(), libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off)?;
        let desc = mem::size_of::<libc::xdp_desc>();
        let rx = Ring::map(fd.as_fd(), &off.rx, cfg.ring_size, desc, libc::XDP_PGOFF_RX_RING as u64)?;
        let fill = Ring::map(fd.as_fd(), &off.fr, fill_size, 8, libc::XDP_UMEM_PGOFF_FILL_RING)?;
        let comp = Ring::map(fd.as_fd(), &off.cr, cfg.ring_size, 8, libc::XDP_UMEM_PGOFF_COMPLETION_RING)?;
        let rx_frames = cfg.frames - cfg.tx_frames;
        let rx_end = u64::from(rx_frames) * u64::from(cfg.frame_size);
        let tx = if cfg.tx_frames > 0 {
            let ring = Ring::map(fd.as_fd(), &off.tx, cfg.ring_size, desc, libc::XDP_PGOFF_TX_RING as u64)?;
            Some(XskTx {
                ring,
                comp,
                fd: fd.try_clone()?,
                umem: Arc::clone(&umem),
                free: (rx_frames..cfg.frames).map(|i| u64::from(i) * u64::from(cfg.frame_size)).collect(),
                lo: rx_end,
                frames: cfg.tx_frames as usize,
                frame_size: cfg.frame_size as usize,
                copy: mode == XskMode::Copy,
                produced: 0,
                pending: 0,
                counts: XskTxCounts::default(),
            })
        } else {
            drop(comp);
            None
        };
        let xsk = Xsk { rx, fill, tx, fd, umem, cfg, mode, rx_end, bad_descs: 0 };
        // Hand the kernel as many receive frames as the fill ring holds.
        let n = fill_size.min(rx_frames);
        for i in 0..n {
            xsk.fill.map.write::<u64>(
                xsk.fill.desc + (i & xsk.fill.mask) as usize * 8,
                u64::from(i) * u64::from(cfg.frame_size),
            );
        }
        xsk.fill.map.word(xsk.fill.producer).store(n, Ordering::Release);
        let sxdp = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_USE_NEED_WAKEUP
                | match mode {
                    XskMode::Copy => libc::XDP_COPY,
                    XskMode::ZeroCopy => libc::XDP_ZEROCOPY,
                },
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sxdp` is a live sockaddr_xdp and its size is passed with it.
        cvt(unsafe {
            libc::bind(
                xsk.fd.as_raw_fd(),
                (&sxdp as *const libc::sockaddr_xdp).cast(),
                mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        })?;
        Ok(xsk)
    }

    /// The mode it is bound in.
    pub fn mode(&self) -> XskMode {
        self.mode
    }

    /// Hands every received frame to `f` (its bytes from the Ethernet header), then
    /// returns the frames to the fill ring. Returns how many.
    pub fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        let rx = &self.rx;
        let prod = rx.map.word(rx.producer).load(Ordering::Acquire);
        let cons = rx.map.word(rx.consumer).load(Ordering::Relaxed);
        let ready = prod.wrapping_sub(cons).min(rx.size);
        if ready == 0 {
            return 0;
        }
        let fill = &self.fill;
        let fprod = fill.map.word(fill.producer).load(Ordering::Relaxed);
        let frame_mask = !(u64::from(self.cfg.frame_size) - 1);
        let mut refilled = 0u32;
        for k in 0..ready {
            let slot = rx.desc + (cons.wrapping_add(k) & rx.mask) as usize * mem::size_of::<libc::xdp_desc>();
            let d: libc::xdp_desc = rx.map.read(slot).unwrap_or(libc::xdp_desc { addr: u64::MAX, len: 0, options: 0 });
            // Only receive frames are handed out and recycled: the transmit half writes
            // the others. (The kernel only fills frames we gave it; a descriptor outside
            // the receive half would be a kernel bug, skipped and counted.)
            if d.addr.saturating_add(u64::from(d.len)) > self.rx_end {
                self.bad_descs += 1;
                continue;
            }
            f(self.umem.bytes(d.addr as usize, d.len as usize));
            // The frame goes straight back: every frame we were given is either in the
            // fill ring, in the kernel, or in the RX ring, so the fill ring has room.
            fill.map
                .write::<u64>(fill.desc + (fprod.wrapping_add(refilled) & fill.mask) as usize * 8, d.addr & frame_mask);
            refilled += 1;
        }
        rx.map.word(rx.consumer).store(cons.wrapping_add(ready), Ordering::Release);
        fill.map.word(fill.producer).store(fprod.wrapping_add(refilled), Ordering::Release);
        ready as usize
    }

    /// Whether the kernel asks to be woken (need-wakeup) to refill from the fill ring.
    pub fn fill_needs_wakeup(&self) -> bool {
        self.fill.map.word(self.fill.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Wakes the kernel's receive processing (a zero-length `recvfrom`).
    pub fn wakeup(&self) -> io::Result<()> {
        // SAFETY: a zero-length receive with null buffers is the documented wake-up
        // (af_xdp.rst, XDP_USE_NEED_WAKEUP); nothing is written.
        let rc = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS)) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The transmit half (once; None without transmit frames). It may be used while
    /// the receive half drains.
    pub fn take_tx(&mut self) -> Option<XskTx> {
        self.tx.take()
    }

    /// The kernel's counters.
    pub fn stats(&self) -> io::Result<XskStats> {
        // SAFETY: an all-zero xdp_statistics is valid; the kernel fills it.
        let mut s: libc::xdp_statistics = unsafe { mem::zeroed() };
        get_raw(self.fd.as_fd(), libc::SOL_XDP, libc::XDP_STATISTICS, &mut s)?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty: s.rx_fill_ring_empty_descs,
        })
    }
}

impl AsFd for Xsk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What the transmit half did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskTxCounts {
    /// Frames put on the TX ring.
    pub frames: u64,
    /// Wake-up system calls (`sendto`) that asked the kernel to transmit.
    pub kicks: u64,
    /// Frames the kernel reported complete.
    pub completed: u64,
    /// Times no transmit frame was free (all in flight).
    pub full: u64,
}

/// The transmit half of an AF_XDP socket: its TX and completion rings and the UMEM
/// frames kept for sending.
#[derive(Debug)]
pub struct XskTx {
    // Drop order: rings, then the descriptor, then (last reference) the UMEM.
    ring: Ring,
    comp: Ring,
    fd: OwnedFd,
    umem: Arc<Umem>,
    /// UMEM offsets of transmit frames no ring holds.
    free: Vec<u64>,
    /// Where the transmit frames start, and how many there are.
    lo: u64,
    frames: usize,
    frame_size: usize,
    /// Bound in copy mode (the kernel transmits in the wake-up call).
    copy: bool,
    /// Descriptors written and not yet published.
    produced: u32,
    /// Published descriptors not yet completed.
    pending: u32,
    counts: XskTxCounts,
}

// SAFETY: as for `Xsk`: the rings are this value's alone, and of the shared UMEM it
// writes only the transmit frames, which the receive half never hands out.
unsafe impl Send for XskTx {}

impl XskTx {
    /// The largest frame one descriptor carries.
    pub fn max_frame(&self) -> usize {
        self.frame_size
    }

    /// What it did so far.
    pub fn counts(&self) -> XskTxCounts {
        self.counts
    }

    /// Takes completed frames back from the completion ring.
    fn reap(&mut self) {
        let c = &self.comp;
        let prod = c.map.word(c.producer).load(Ordering::Acquire);
        let cons = c.map.word(c.consumer).load(Ordering::Relaxed);
        let ready = prod.wrapping_sub(cons).min(c.size);
        for k in 0..ready {
            let addr = c.map.read::<u64>(c.desc + (cons.wrapping_add(k) & c.mask) as usize * 8).unwrap_or(u64::MAX);
            // Only our own transmit frames come back (a stray offset is dropped).
            if addr >= self.lo && (addr as usize) < self.umem.len && self.free.len() < self.frames {
                self.free.push(addr);
            }
        }
        c.map.word(c.consumer).store(cons.wrapping_add(ready), Ordering::Release);
        self.pending = self.pending.saturating_sub(ready);
        self.counts.completed += u64::from(ready);
    }

    /// Queues one frame of `len` bytes written by `fill`. Returns false (calling
    /// nothing) when every transmit frame is in flight or the ring is full: flush and
    /// try again later.
    pub fn push(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> io::Result<bool> {
        if len == 0 || len > self.frame_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a {len}-byte frame: a UMEM frame holds 1..={}", self.frame_size),
            ));
        }
        if self.free.is_empty() {
            self.reap();
        }
        let r = &self.ring;
        let prod = r.map.word(r.producer).load(Ordering::Relaxed).wrapping_add(self.produced);
        let cons = r.map.word(r.consumer).load(Ordering::Acquire);
        let Some(addr) = self.free.last().copied().filter(|_| prod.wrapping_sub(cons) < r.size) else {
            self.counts.full += 1;
            return Ok(false);
        };
        self.free.pop();
        let off = addr as usize;
        assert!(off + len <= self.umem.len, "transmit frame outside the UMEM");
        // SAFETY: `[off, off + len)` is inside the UMEM (asserted) and is a transmit
        // frame taken from the free list: no ring holds it, the kernel is not reading
        // it, and the receive half never hands out transmit frames, so this is the only
        // reference to these bytes until the descriptor is published.
        let data = unsafe { std::slice::from_raw_parts_mut(self.umem.at(off), len) };
        fill(data);
        let slot = r.desc + (prod & r.mask) as usize * mem::size_of::<libc::xdp_desc>();
        r.map.write(slot, libc::xdp_desc { addr, len: len as u32, options: 0 });
        self.produced += 1;
        self.counts.frames += 1;
        Ok(true)
    }

    /// Publishes the queued descriptors and wakes the kernel to send them (in copy
    /// mode the `sendto` transmits; it sends a batch per call, so it is repeated while
    /// the kernel asks). Completed frames are taken back.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.produced > 0 {
            let r = &self.ring;
            let prod = r.map.word(r.producer).load(Ordering::Relaxed).wrapping_add(self.produced);
            r.map.word(r.producer).store(prod, Ordering::Release);
            self.pending += self.produced;
            self.produced = 0;
        }
        // Zero-copy: the driver sends; one wake-up, and only when it asks for one.
        // Copy mode: each sendto transmits up to the kernel's batch (32), so repeat
        // (bounded) while descriptors wait, taking completions back in between (the
        // kernel answers EAGAIN when the completion ring has no room).
        let rounds = if self.copy { 64 } else { 1 };
        for _ in 0..rounds {
            let r = &self.ring;
            let left = r
                .map
                .word(r.producer)
                .load(Ordering::Relaxed)
                .wrapping_sub(r.map.word(r.consumer).load(Ordering::Acquire));
            let asks = r.map.word(r.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0;
            if left == 0 || (!self.copy && !asks) {
                break;
            }
            self.counts.kicks += 1;
            // SAFETY: a zero-length sendto with null buffers is the documented TX
            // wake-up (af_xdp.rst); nothing is read from user memory.
            let rc = unsafe {
                libc::sendto(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0)
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::EBUSY) => self.reap(),
                    Some(libc::ENOBUFS) => break,
                    _ => return Err(e),
                }
            }
        }
        self.reap();
        Ok(())
    }

    /// The most frames that can be queued at once.
    pub fn capacity(&self) -> usize {
        self.frames.min(self.ring.size as usize)
    }

    /// Whether `n` frames can be queued now (free transmit frames and ring slots), so a
    /// datagram's frames go out whole or not at all.
    pub fn room(&mut self, n: usize) -> bool {
        if self.free.len() < n {
            self.reap();
        }
        let r = &self.ring;
        let prod = r.map.word(r.producer).load(Ordering::Relaxed).wrapping_add(self.produced);
        let used = prod.wrapping_sub(r.map.word(r.consumer).load(Ordering::Acquire)) as usize;
        self.free.len() >= n && used + n <= r.size as usize
    }

    /// Descriptors published and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.pending
    }
}

impl AsFd for XskTx {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
