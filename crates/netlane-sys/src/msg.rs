//! `sendmsg`, `recvmsg`, `sendmmsg` and `recvmmsg` over caller-owned buffers.
//!
//! These are the hot paths of every datagram benchmark, so nothing here allocates per
//! call: headers are built on the stack and point into the caller's buffers for the
//! duration of the call only.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::{self, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

use socket2::SockAddr;

use crate::cvt;

/// Most messages one `sendmmsg`/`recvmmsg` call made by this module carries. The kernel
/// allows up to `UIO_MAXIOV` (1024); 64 matches the GSO segment limit and keeps the
/// header array on the stack small.
pub const MAX_MMSG: usize = 64;

/// What one received message produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    /// Bytes of data (for a truncated datagram: the full datagram length if
    /// `MSG_TRUNC` was passed, else the bytes copied).
    pub len: usize,
    /// `msg_flags` (`MSG_TRUNC`, `MSG_CTRUNC`, ...).
    pub flags: i32,
    /// Bytes of control data written.
    pub control_len: usize,
}

impl Received {
    /// The datagram did not fit the buffer.
    pub fn truncated(&self) -> bool {
        self.flags & libc::MSG_TRUNC != 0
    }

    /// The control data did not fit its buffer.
    pub fn control_truncated(&self) -> bool {
        self.flags & libc::MSG_CTRUNC != 0
    }
}

/// Builds a `msghdr` pointing at the given parts.
#[inline]
fn msghdr(
    name: *mut libc::c_void,
    namelen: libc::socklen_t,
    iov: *mut libc::iovec,
    iovlen: usize,
    control: *mut libc::c_void,
    controllen: usize,
) -> libc::msghdr {
    // SAFETY: msghdr is a plain C struct of pointers and integers (plus private padding
    // on some targets) for which all-zero bytes are a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_name = name;
    msg.msg_namelen = namelen;
    msg.msg_iov = iov;
    msg.msg_iovlen = iovlen as _;
    if controllen > 0 {
        msg.msg_control = control;
        msg.msg_controllen = controllen as _;
    }
    msg
}

#[inline]
fn name_parts(dst: Option<&SockAddr>) -> (*mut libc::c_void, libc::socklen_t) {
    match dst {
        Some(addr) => (addr.as_ptr() as *mut libc::c_void, addr.len()),
        None => (ptr::null_mut(), 0),
    }
}

/// `sendmmsg(2)` with a destination per datagram: sends up to [`MAX_MMSG`] of
/// `datagrams` (each to its own address) in one call; returns how many were sent.
pub fn sendmmsg_each(fd: BorrowedFd<'_>, datagrams: &[(SockAddr, IoSlice<'_>)], flags: i32) -> io::Result<usize> {
    let n = datagrams.len().min(MAX_MMSG);
    if n == 0 {
        return Ok(0);
    }
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_MMSG];
    for (slot, (dst, dgram)) in hdrs.iter_mut().zip(&datagrams[..n]) {
        let (name, namelen) = name_parts(Some(dst));
        slot.write(libc::mmsghdr {
            // A single IoSlice is one struct iovec (ABI-compatible, std docs).
            msg_hdr: msghdr(name, namelen, dgram as *const IoSlice<'_> as *mut libc::iovec, 1, ptr::null_mut(), 0),
            msg_len: 0,
        });
    }
    // SAFETY: the first `n` headers were initialised above and point at addresses and
    // buffers borrowed for the whole call; sendmmsg(2) reads them and writes only
    // `msg_len` of the first `n` headers.
    let sent = cvt(unsafe {
        libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr().cast::<libc::mmsghdr>(), n as libc::c_uint, flags)
    })?;
    Ok(sent as usize)
}

/// `sendmsg(2)`: sends one datagram (or stream chunk) gathered from `iov`, to `dst` (or
/// the connected peer), with encoded control messages (see [`crate::cmsg`]).
#[inline]
pub fn sendmsg(
    fd: BorrowedFd<'_>,
    dst: Option<&SockAddr>,
    iov: &[IoSlice<'_>],
    control: &[u8],
    flags: i32,
) -> io::Result<usize> {
    let (name, namelen) = name_parts(dst);
    let msg = msghdr(
        name,
        namelen,
        // IoSlice is guaranteed ABI-compatible with struct iovec (std::io::IoSlice docs).
        iov.as_ptr() as *mut libc::iovec,
        iov.len(),
        control.as_ptr() as *mut libc::c_void,
        control.len(),
    );
    // SAFETY: `msg` points at `dst`, `iov` and `control`, which are borrowed for the
    // whole call; sendmsg(2) only reads them and keeps no reference after returning
    // (with MSG_ZEROCOPY the kernel pins the pages itself, see msg_zerocopy.rst).
    let n = cvt(unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, flags) })?;
    Ok(n as usize)
}

/// `send(2)` of one buffer on a connected socket. Cheaper than [`sendmsg`] when there is
/// no destination and no control data: the kernel copies and checks no `msghdr` and
/// imports no iovec.
#[inline]
pub fn send(fd: BorrowedFd<'_>, buf: &[u8], flags: i32) -> io::Result<usize> {
    // SAFETY: `buf` is borrowed for the call and its length is passed with it;
    // send(2) only reads it.
    let n = cvt(unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags) })?;
    Ok(n as usize)
}

/// `sendmmsg(2)`: sends up to [`MAX_MMSG`] datagrams, one per slice of `datagrams`, all
/// to `dst` (or the connected peer) and all with the same control messages, in one
/// system call. Returns how many the kernel accepted (possibly fewer than offered; the
/// caller sends the rest again).
#[inline]
pub fn sendmmsg(
    fd: BorrowedFd<'_>,
    dst: Option<&SockAddr>,
    datagrams: &[IoSlice<'_>],
    control: &[u8],
    flags: i32,
) -> io::Result<usize> {
    let n = datagrams.len().min(MAX_MMSG);
    if n == 0 {
        return Ok(0);
    }
    let (name, namelen) = name_parts(dst);
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_MMSG];
    for (slot, dgram) in hdrs.iter_mut().zip(&datagrams[..n]) {
        slot.write(libc::mmsghdr {
            msg_hdr: msghdr(
                name,
                namelen,
                // A single IoSlice is one struct iovec (ABI-compatible, std docs).
                dgram as *const IoSlice<'_> as *mut libc::iovec,
                1,
                control.as_ptr() as *mut libc::c_void,
                control.len(),
            ),
            msg_len: 0,
        });
    }
    // SAFETY: the first `n` headers were initialised above and point at buffers
    // borrowed for the whole call; sendmmsg(2) reads them and writes only `msg_len` of
    // the first `n` headers.
    let sent = cvt(unsafe {
        libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr().cast::<libc::mmsghdr>(), n as libc::c_uint, flags)
    })?;
    Ok(sent as usize)
}

/// `recvmsg(2)` into `iov` with room for control data; optionally returns the source
/// address. With `MSG_ERRQUEUE` and an empty `iov` it reads one error-queue record.
pub fn recvmsg(
    fd: BorrowedFd<'_>,
    iov: &mut [IoSliceMut<'_>],
    control: &mut [u8],
    want_source: bool,
    flags: i32,
) -> io::Result<(Received, Option<SocketAddr>)> {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let (name, namelen) = if want_source {
        (
            (&mut storage as *mut libc::sockaddr_storage).cast::<libc::c_void>(),
            mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        )
    } else {
        (ptr::null_mut(), 0)
    };
    let mut msg = msghdr(
        name,
        namelen,
        // IoSliceMut is guaranteed ABI-compatible with struct iovec (std docs).
        iov.as_mut_ptr().cast::<libc::iovec>(),
        iov.len(),
        control.as_mut_ptr().cast::<libc::c_void>(),
        control.len(),
    );
    // SAFETY: `msg` points at `storage`, `iov` and `control`, all exclusively borrowed
    // for the call; recvmsg(2) writes at most the lengths given in the header.
    let n = cvt(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) })?;
    let received = Received {
        len: n as usize,
        flags: msg.msg_flags,
        control_len: if control.is_empty() { 0 } else { msg.msg_controllen },
    };
    let source = if want_source { sockaddr_to_std(&storage, msg.msg_namelen) } else { None };
    Ok((received, source))
}

/// Reads one record from the socket's error queue without blocking.
/// `Ok(None)`: the queue is empty. On `Ok(Some(r))` the record is in
/// `control[..r.control_len]`.
pub fn recv_errqueue(fd: BorrowedFd<'_>, control: &mut [u8]) -> io::Result<Option<Received>> {
    match recvmsg(fd, &mut [], control, false, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) {
        Ok((r, _)) => Ok(Some(r)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Converts a kernel-filled socket address to a std one (IPv4/IPv6 only).
fn sockaddr_to_std(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(storage.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family is AF_INET and the kernel wrote at least a full
            // sockaddr_in; sockaddr_storage is aligned for every sockaddr type.
            let sin = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family is AF_INET6 and the kernel wrote a full sockaddr_in6;
            // sockaddr_storage is aligned for every sockaddr type.
            let sin6 = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Per-message result in a [`RecvBatch`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotMeta {
    /// What the kernel reported for this message.
    pub received: Received,
    /// Length of the source address written for this slot (0 if not requested).
    pub name_len: u32,
}

/// Buffers for receiving up to [`MAX_MMSG`] datagrams per call: a slab of equal slots,
/// a control area per slot and optionally a source address per slot.
pub struct RecvBatch {
    slab: Vec<u8>,
    slot_len: usize,
    slots: usize,
    control: Vec<u8>,
    control_per_slot: usize,
    names: Vec<libc::sockaddr_storage>,
    meta: Vec<SlotMeta>,
    filled: usize,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("slots", &self.slots)
            .field("slot_len", &self.slot_len)
            .field("control_per_slot", &self.control_per_slot)
            .field("filled", &self.filled)
            .finish()
    }
}

impl RecvBatch {
    /// `slots` messages of up to `slot_len` bytes each (clamped to 1..=[`MAX_MMSG`]),
    /// with `control_per_slot` bytes of control space (rounded up to the cmsg
    /// alignment), recording source addresses if `with_sources`.
    pub fn new(slots: usize, slot_len: usize, control_per_slot: usize, with_sources: bool) -> Self {
        let slots = slots.clamp(1, MAX_MMSG);
        let control_per_slot = crate::cmsg::align(control_per_slot);
        // SAFETY: sockaddr_storage is plain data; all-zero is valid.
        let empty_name: libc::sockaddr_storage = unsafe { mem::zeroed() };
        Self {
            slab: vec![0; slots * slot_len],
            slot_len,
            slots,
            control: vec![0; slots * control_per_slot],
            control_per_slot,
            names: if with_sources { vec![empty_name; slots] } else { Vec::new() },
            meta: vec![SlotMeta::default(); slots],
            filled: 0,
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Messages filled by the last call.
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// `recvmmsg(2)`: fills up to `max` slots (at most [`RecvBatch::slots`]) in one
    /// system call. Pass `MSG_WAITFORONE` to block only for the first message.
    pub fn recv_many(&mut self, fd: BorrowedFd<'_>, max: usize, flags: i32) -> io::Result<usize> {
        let n = max.clamp(1, self.slots);
        let with_names = !self.names.is_empty();
        let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_MMSG];
        let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_MMSG];
        let slab = self.slab.as_mut_ptr();
        let control = self.control.as_mut_ptr();
        let names = self.names.as_mut_ptr();
        for i in 0..n {
            // Pointer arithmetic stays inside the allocations: i < slots, and slab,
            // control and names hold `slots` entries each.
            let iov = iovs[i]
                .write(libc::iovec { iov_base: slab.wrapping_add(i * self.slot_len).cast(), iov_len: self.slot_len });
            let (name, namelen) = if with_names {
                (
                    names.wrapping_add(i).cast::<libc::c_void>(),
                    mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
                )
            } else {
                (ptr::null_mut(), 0)
            };
            hdrs[i].write(libc::mmsghdr {
                msg_hdr: msghdr(
                    name,
                    namelen,
                    iov,
                    1,
                    control.wrapping_add(i * self.control_per_slot).cast(),
                    self.control_per_slot,
                ),
                msg_len: 0,
            });
        }
        // SAFETY: the first `n` headers and iovecs are initialised and point at
        // disjoint regions of buffers owned by `self`, which is exclusively borrowed for
        // the call; recvmmsg(2) writes at most the lengths each header gives. A null
        // timeout means no timeout.
        let got = cvt(unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                n as libc::c_uint,
                flags,
                ptr::null_mut(),
            )
        })? as usize;
        for (i, hdr) in hdrs.iter().take(got).enumerate() {
            // SAFETY: header i < n was initialised above; the kernel updated it in place.
            let hdr = unsafe { hdr.assume_init_ref() };
            self.meta[i] = SlotMeta {
                received: Received {
                    len: hdr.msg_len as usize,
                    flags: hdr.msg_hdr.msg_flags,
                    control_len: hdr.msg_hdr.msg_controllen,
                },
                name_len: hdr.msg_hdr.msg_namelen,
            };
        }
        self.filled = got;
        Ok(got)
    }

    /// `recvmsg(2)` into slot 0 (one datagram per system call).
    pub fn recv_one(&mut self, fd: BorrowedFd<'_>, flags: i32) -> io::Result<usize> {
        let want_source = !self.names.is_empty();
        let slot_len = self.slot_len;
        let control_len = self.control_per_slot;
        let (received, source) = recvmsg(
            fd,
            &mut [IoSliceMut::new(&mut self.slab[..slot_len])],
            &mut self.control[..control_len],
            want_source,
            flags,
        )?;
        self.meta[0] = SlotMeta { received, name_len: 0 };
        if let (Some(addr), Some(slot)) = (source, self.names.first_mut()) {
            *slot = std_to_storage(addr);
            self.meta[0].name_len = mem::size_of::<libc::sockaddr_storage>() as u32;
        }
        self.filled = 1;
        Ok(1)
    }

    /// Metadata of filled slot `i`.
    pub fn meta(&self, i: usize) -> SlotMeta {
        self.meta[i]
    }

    /// Data of filled slot `i` (clamped to the slot on truncation).
    pub fn data(&self, i: usize) -> &[u8] {
        let len = self.meta[i].received.len.min(self.slot_len);
        &self.slab[i * self.slot_len..i * self.slot_len + len]
    }

    /// Mutable data of filled slot `i`.
    pub fn data_mut(&mut self, i: usize) -> &mut [u8] {
        let len = self.meta[i].received.len.min(self.slot_len);
        &mut self.slab[i * self.slot_len..i * self.slot_len + len]
    }

    /// Control data of filled slot `i`.
    pub fn control(&self, i: usize) -> &[u8] {
        let len = self.meta[i].received.control_len.min(self.control_per_slot);
        let start = i * self.control_per_slot;
        &self.control[start..start + len]
    }

    /// Source address of filled slot `i`, if sources were requested.
    pub fn source(&self, i: usize) -> Option<SocketAddr> {
        let storage = self.names.get(i)?;
        sockaddr_to_std(storage, self.meta[i].name_len)
    }
}

fn std_to_storage(addr: SocketAddr) -> libc::sockaddr_storage {
    let sa = SockAddr::from(addr);
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut out: libc::sockaddr_storage = unsafe { mem::zeroed() };
    // SAFETY: `sa` holds `sa.len()` initialised bytes (<= sizeof(sockaddr_storage)) and
    // `out` is a distinct local of that size.
    unsafe {
        ptr::copy_nonoverlapping(
            sa.as_ptr().cast::<u8>(),
            (&mut out as *mut libc::sockaddr_storage).cast::<u8>(),
            sa.len() as usize,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmsg::CmsgBuf;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    fn pair() -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        (tx, rx)
    }

    #[test]
    fn sendmsg_and_recvmsg_with_source() {
        let (tx, rx) = pair();
        let n = sendmsg(tx.as_fd(), None, &[IoSlice::new(b"he"), IoSlice::new(b"llo")], &[], 0).unwrap();
        assert_eq!(n, 5);
        let mut buf = [0u8; 16];
        let (r, src) = recvmsg(rx.as_fd(), &mut [IoSliceMut::new(&mut buf)], &mut [], true, 0).unwrap();
        assert_eq!(&buf[..r.len], b"hello");
        assert_eq!(src, Some(tx.local_addr().unwrap()));
        assert!(!r.truncated());
    }

    #[test]
    fn sendmmsg_then_recvmmsg() {
        let (tx, rx) = pair();
        let msgs: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + i as usize]).collect();
        let iov: Vec<IoSlice<'_>> = msgs.iter().map(|m| IoSlice::new(m)).collect();
        assert_eq!(sendmmsg(tx.as_fd(), None, &iov, &[], 0).unwrap(), 10);
        let mut batch = RecvBatch::new(16, 2048, 64, true);
        let mut got = Vec::new();
        while got.len() < 10 {
            let n = batch.recv_many(rx.as_fd(), 16, libc::MSG_WAITFORONE).unwrap();
            for i in 0..n {
                assert_eq!(batch.source(i), Some(tx.local_addr().unwrap()));
                got.push(batch.data(i).to_vec());
            }
        }
        assert_eq!(got, msgs);
    }

    #[test]
    fn sendmsg_to_explicit_destination() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = SockAddr::from(rx.local_addr().unwrap());
        sendmsg(tx.as_fd(), Some(&dst), &[IoSlice::new(b"x")], &[], 0).unwrap();
        let mut batch = RecvBatch::new(1, 64, 0, true);
        batch.recv_one(rx.as_fd(), 0).unwrap();
        assert_eq!(batch.data(0), b"x");
        assert_eq!(batch.source(0), Some(tx.local_addr().unwrap()));
    }

    #[test]
    fn truncation_is_reported() {
        let (tx, rx) = pair();
        tx.send(&[1u8; 100]).unwrap();
        let mut batch = RecvBatch::new(1, 10, 0, false);
        batch.recv_one(rx.as_fd(), libc::MSG_TRUNC).unwrap();
        let m = batch.meta(0);
        assert!(m.received.truncated());
        assert_eq!(m.received.len, 100);
        assert_eq!(batch.data(0).len(), 10);
    }

    #[test]
    fn empty_errqueue_is_none() {
        let (tx, _rx) = pair();
        let mut ctl = CmsgBuf::<128>::new();
        assert!(recv_errqueue(tx.as_fd(), ctl.as_mut_capacity()).unwrap().is_none());
    }

    #[test]
    fn bad_control_message_is_an_error_not_a_crash() {
        let (tx, _rx) = pair();
        let mut ctl = CmsgBuf::<64>::new();
        // UDP_SEGMENT must be a u16: a u32 is rejected by the kernel with EINVAL.
        ctl.push(libc::SOL_UDP, libc::UDP_SEGMENT, &1400u32.to_ne_bytes()).unwrap();
        let err = sendmsg(tx.as_fd(), None, &[IoSlice::new(&[0u8; 3000])], ctl.as_bytes(), 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }
}
