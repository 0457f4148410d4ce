//! AF_XDP receive sockets: a UMEM of fixed-size frames, its fill and completion rings,
//! and an RX ring, all memory-mapped and shared with the kernel (af_xdp.rst).
//!
//! Each ring is single-producer single-consumer: the producer writes descriptors, then
//! publishes its index with release ordering; the consumer reads the index with acquire
//! ordering, reads the descriptors, then publishes its own index (release) so the
//! producer may reuse the slots. Here user space produces the fill ring and consumes the
//! RX ring; the completion ring exists because binding requires it (nothing is sent).

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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

/// An AF_XDP socket bound to one queue of one interface, receiving only.
#[derive(Debug)]
pub struct Xsk {
    // Field order is drop order: the rings and socket go before the UMEM they use.
    rx: Ring,
    fill: Ring,
    _comp: Ring,
    fd: OwnedFd,
    umem: Mapping,
    cfg: XskConfig,
    mode: XskMode,
}

// SAFETY: every mapping belongs to this value alone; the kernel is the only other party
// and synchronises through the ring indexes, whichever thread we run on.
unsafe impl Send for Xsk {}

impl Xsk {
    /// Creates the socket and its UMEM, fills the fill ring, and binds to `queue` of
    /// interface `ifindex` in `mode`, with need-wakeup.
    pub fn open(ifindex: u32, queue: u32, cfg: XskConfig, mode: XskMode) -> io::Result<Xsk> {
        if !cfg.ring_size.is_power_of_two() || !cfg.frame_size.is_power_of_two() || cfg.frames == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "AF_XDP ring size and frame size must be powers of two, with at least one frame",
            ));
        }
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let raw = cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Mapping::new(cfg.umem_bytes(), None, 0)?;
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
        // SAFETY: an all-zero xdp_mmap_offsets is valid; the kernel fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { mem::zeroed() };
        get_raw(fd.as_fd(), libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off)?;
        let desc = mem::size_of::<libc::xdp_desc>();
        let rx = Ring::map(fd.as_fd(), &off.rx, cfg.ring_size, desc, libc::XDP_PGOFF_RX_RING as u64)?;
        let fill = Ring::map(fd.as_fd(), &off.fr, fill_size, 8, libc::XDP_UMEM_PGOFF_FILL_RING)?;
        let comp = Ring::map(fd.as_fd(), &off.cr, cfg.ring_size, 8, libc::XDP_UMEM_PGOFF_COMPLETION_RING)?;
        let xsk = Xsk { rx, fill, _comp: comp, fd, umem, cfg, mode };
        // Hand the kernel as many frames as the fill ring holds.
        let n = fill_size.min(cfg.frames);
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
        for k in 0..ready {
            let slot = rx.desc + (cons.wrapping_add(k) & rx.mask) as usize * mem::size_of::<libc::xdp_desc>();
            let d: libc::xdp_desc = rx.map.read(slot).unwrap_or(libc::xdp_desc { addr: 0, len: 0, options: 0 });
            f(self.umem.bytes(d.addr as usize, d.len as usize));
            // The frame goes straight back: every frame we were given is either in the
            // fill ring, in the kernel, or in the RX ring, so the fill ring has room.
            let faddr = d.addr & frame_mask;
            fill.map.write::<u64>(fill.desc + (fprod.wrapping_add(k) & fill.mask) as usize * 8, faddr);
        }
        rx.map.word(rx.consumer).store(cons.wrapping_add(ready), Ordering::Release);
        fill.map.word(fill.producer).store(fprod.wrapping_add(ready), Ordering::Release);
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
