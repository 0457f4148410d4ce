//! Typed socket options that `socket2` does not wrap: UDP GSO/GRO, zerocopy, txtime,
//! busy polling and the NAPI id. Thin, safe wrappers over [`netlane_sys::sockopt`].

use std::io;
use std::os::fd::BorrowedFd;

use netlane_sys::sockopt::{get_int, set_int, set_u64};

/// `UDP_SEGMENT` as a socket default: every send is segmented at `gso_size` (0 = off).
pub fn set_udp_segment(fd: BorrowedFd<'_>, gso_size: u16) -> io::Result<()> {
    set_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, i32::from(gso_size))
}

/// Reads the socket's default `UDP_SEGMENT`.
pub fn udp_segment(fd: BorrowedFd<'_>) -> io::Result<u16> {
    get_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT).map(|v| v.clamp(0, i32::from(u16::MAX)) as u16)
}

/// `UDP_GRO`: receive coalesced trains with a `UDP_GRO` control message.
pub fn set_udp_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_int(fd, libc::SOL_UDP, libc::UDP_GRO, i32::from(on))
}

/// `SO_ZEROCOPY`: allow `MSG_ZEROCOPY` sends.
pub fn set_zerocopy(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_ZEROCOPY, i32::from(on))
}

/// `SO_TXTIME` on `CLOCK_MONOTONIC` (what fq expects), reporting errors on the error
/// queue.
pub fn set_txtime_monotonic(fd: BorrowedFd<'_>) -> io::Result<()> {
    netlane_sys::sockopt::set_txtime(fd, libc::CLOCK_MONOTONIC, netlane_sys::consts::SOF_TXTIME_REPORT_ERRORS)
}

/// `SO_TXTIME` on `CLOCK_TAI` (the only clock etf and taprio take), reporting errors on
/// the error queue.
pub fn set_txtime_tai(fd: BorrowedFd<'_>) -> io::Result<()> {
    netlane_sys::sockopt::set_txtime(fd, libc::CLOCK_TAI, netlane_sys::consts::SOF_TXTIME_REPORT_ERRORS)
}

/// `SO_MAX_PACING_RATE` in bytes per second (honoured by TCP, and by fq for others).
pub fn set_max_pacing_rate(fd: BorrowedFd<'_>, bytes_per_sec: u64) -> io::Result<()> {
    set_u64(fd, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE, bytes_per_sec)
}

/// `SO_RCVBUFFORCE` (needs CAP_NET_ADMIN), falling back to `SO_RCVBUF` (capped by
/// `net.core.rmem_max`). Returns the size the kernel reports afterwards.
pub fn set_recv_buffer(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let v = bytes.min(i32::MAX as usize / 2) as i32;
    if set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v).is_err() {
        set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v)?;
    }
    get_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).map(|v| v.max(0) as usize)
}

/// `SO_SNDBUFFORCE`, falling back to `SO_SNDBUF`. Returns the resulting size.
pub fn set_send_buffer(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let v = bytes.min(i32::MAX as usize / 2) as i32;
    if set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
        set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)?;
    }
    get_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).map(|v| v.max(0) as usize)
}

/// `SO_INCOMING_NAPI_ID`: the NAPI instance the socket's last packet arrived through
/// (0 = none: loopback, or veth without NAPI).
pub fn incoming_napi_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    get_int(fd, libc::SOL_SOCKET, libc::SO_INCOMING_NAPI_ID).map(|v| v as u32)
}

/// `SO_BUSY_POLL`: microseconds to busy-poll on a blocking read.
pub fn set_busy_poll(fd: BorrowedFd<'_>, usecs: u32) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_BUSY_POLL, usecs.min(i32::MAX as u32) as i32)
}

/// `SO_PREFER_BUSY_POLL` (Linux 5.11).
pub fn set_prefer_busy_poll(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_PREFER_BUSY_POLL, i32::from(on))
}

/// `SO_BUSY_POLL_BUDGET` (Linux 5.11; above 64 needs CAP_NET_ADMIN).
pub fn set_busy_poll_budget(fd: BorrowedFd<'_>, budget: u16) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_BUSY_POLL_BUDGET, i32::from(budget))
}

/// `IP_MTU_DISCOVER`/`IPV6_MTU_DISCOVER` = `PMTUDISC_DO`: never fragment; a datagram
/// above the path MTU fails with EMSGSIZE instead. GSO needs this to report bad
/// segment sizes rather than fragment them.
pub fn set_dont_fragment(fd: BorrowedFd<'_>, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)
    } else {
        set_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
    }
}

/// `IP_MTU`/`IPV6_MTU` of a connected socket: the path MTU the kernel knows.
pub fn path_mtu(fd: BorrowedFd<'_>, ipv6: bool) -> io::Result<usize> {
    let v = if ipv6 {
        get_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU)?
    } else {
        get_int(fd, libc::IPPROTO_IP, libc::IP_MTU)?
    };
    Ok(v.max(0) as usize)
}
