//! Memory shared with the kernel: one `mmap` region, bounds-checked accessors, unmapped
//! on drop. Used by the packet rings and the AF_XDP rings and UMEM.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

/// A memory mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd` at `offset` (shared with the kernel), or anonymous memory.
    pub(crate) fn new(len: usize, fd: Option<BorrowedFd<'_>>, offset: libc::off_t) -> io::Result<Mapping> {
        let (flags, raw) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel (null hint); for a socket it maps
        // the ring the kernel allocated at `offset` (packet_mmap.rst, af_xdp.rst), for
        // none anonymous zeroed memory. The result is checked.
        let p =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, raw, offset) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mapping { ptr, len })
    }

    /// A pointer `offset` bytes in; callers keep `offset <= len`.
    pub(crate) fn at(&self, offset: usize) -> *mut u8 {
        assert!(offset <= self.len, "offset outside the mapping");
        // SAFETY: `offset <= len` (asserted), so the pointer stays within the mapping
        // or one past its end.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// The 32-bit word at `offset` (4-aligned, inside), shared with the kernel.
    pub(crate) fn word(&self, offset: usize) -> &AtomicU32 {
        assert!(offset + 4 <= self.len && offset.is_multiple_of(4), "ring word outside the mapping");
        let p = self.at(offset).cast::<AtomicU32>();
        // SAFETY: inside the mapping and aligned (asserted); the kernel updates it
        // concurrently, which an atomic allows. Lives as long as `self`.
        unsafe { &*p }
    }

    /// A `T` at `offset`, or `None` when it would reach past the mapping (offsets the
    /// kernel wrote must not make us read outside it).
    pub(crate) fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        if offset.checked_add(mem::size_of::<T>())? > self.len {
            return None;
        }
        let p = self.at(offset).cast::<T>();
        // SAFETY: in bounds (checked); read_unaligned makes no alignment assumption and
        // `T` is a plain C struct for which any bytes are a valid value.
        Some(unsafe { p.read_unaligned() })
    }

    pub(crate) fn write<T: Copy>(&self, offset: usize, v: T) {
        assert!(offset + mem::size_of::<T>() <= self.len, "write outside the mapping");
        let p = self.at(offset).cast::<T>();
        // SAFETY: in bounds (asserted); the slot belongs to the producer (us) until the
        // producer index is published.
        unsafe { p.write_unaligned(v) }
    }

    /// The bytes `[offset, offset + len)` to write (a transmit slot user space owns),
    /// or `None` when that is outside the mapping.
    pub(crate) fn bytes_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        let p = self.at(offset);
        // SAFETY: in bounds (checked); `&mut self` makes this the only slice handed out,
        // and callers write only slots the kernel has handed back (status AVAILABLE, or
        // a UMEM frame no ring holds), which the kernel does not read until published.
        Some(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }

    /// The bytes `[offset, offset + len)`, or an empty slice when that is outside the
    /// mapping.
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                let p = self.at(offset);
                // SAFETY: in bounds (checked); callers read frames the kernel has handed
                // to user space (and does not write until they are handed back).
                unsafe { std::slice::from_raw_parts(p, len) }
            }
            _ => &[],
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the region mmap returned; no borrow outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
